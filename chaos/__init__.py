"""A fault-injection harness for lockwarden's shared lock store (chaos/README.md).

Workers take locks and increment registers kept behind fences; a nemesis
kills, pauses and disconnects them; every operation goes to a history that
a checker reads afterwards. See README.md beside this file.
"""
