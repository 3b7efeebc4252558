"""Every command pyinfra runs on a node waits ~40 ms for nothing unless the SSH socket sends at once.

pyinfra runs each fact and operation command in a new SSH channel (open, exec, output, exit status,
close): a handful of small messages each way. paramiko leaves Nagle's algorithm on for the socket, and
OpenSSH's sshd turns it off only for sessions with a terminal, so a small message that follows another
one not yet acknowledged is held back until the peer's delayed ACK (40 ms on Linux). Measured against a
sandbox node on loopback: 48 ms a command with Nagle on, 4.8 ms with ``TCP_NODELAY`` on the control
node's socket (BENCHMARKS.md). OpenSSH's own client sets it for interactive sessions for the same reason.
The messages are the same, so nothing else about the connection changes.
"""

from __future__ import annotations

import socket

from pyinfra.connectors.ssh import SSHConnector


def no_delay(sock) -> bool:
    """Set TCP_NODELAY on ``sock`` if it is a TCP socket (a ProxyCommand or jump-host channel is not);
    whether it is set now."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def install() -> None:
    """Wrap SSHConnector._connect once (idempotent): its socket sends without delay once connected."""
    if getattr(SSHConnector._connect, "_no_delay", False):
        return
    connect = SSHConnector._connect

    def _connect(self) -> None:
        connect(self)
        transport = self.client.get_transport() if self.client is not None else None
        if transport is not None:
            no_delay(transport.sock)

    _connect._no_delay = True
    SSHConnector._connect = _connect
