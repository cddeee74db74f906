"""The directory scope: every process of a host that names one local directory
shares flights through a coordinator elected among them.

- ``fs``: the directory's files, the network file system check, the epoch.
- ``wire``: the handshake and the frames (docs/directory-protocol.md).
- ``coordinator``: the elected server that decides lead or join for the directory.
- ``client``: the arbiter a group uses: election, connection, key locks, leases.
"""
