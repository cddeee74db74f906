"""The fleet scope: every process on every host that names one Redis and namespace
shares flights, decided by atomic scripts, with leases and fencing tokens.

- ``scripts``: the Lua scripts (docs/fleet-protocol.md).
- ``arbiter``: the arbiter a group uses: lead or join, mailboxes, lease renewal.
"""
