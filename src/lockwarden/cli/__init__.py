"""The ``lockwarden`` command line: the shared store without writing code.

``lockwarden run NAME -- CMD`` is flock(1) for a fleet of hosts, ``hold``
keeps a lock across shell statements; ``status``, ``break``, ``clean``,
``permits`` and ``init`` look after the store. docs/cli.md is the manual.

Which file holds what:

- ``main.py``: the entry point: every command and option (the parser), the
  dispatch to a command's module, and each failure as one line and an exit
  status. Help, completion and the man page all come from its parser.
- ``common.py``: the exit statuses, the store to use and how it is opened,
  a command's result as text or JSON.
- ``terminal.py``: what reaches a person: control characters escaped, the
  one-line failure; ``progress.py``: the line shown while waiting for a lock.
- ``run.py`` (`run`), ``hold.py`` (`hold`), ``status.py`` (`status`),
  ``admin.py`` (`break`, `clean`, `permits`, `init`), ``generate.py``
  (`completion`, `manpage`): one command, or one kind of command, each.

This package imports nothing itself: the entry point is ``main.main``, and a
command's module is imported only when that command runs.
"""
