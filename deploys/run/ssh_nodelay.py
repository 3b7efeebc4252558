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

from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_state


def no_delay(sock) -> bool:
    """Set TCP_NODELAY on ``sock`` if it is a TCP socket (a ProxyCommand or jump-host channel is not);
    whether it is set now."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def host_no_delay(host) -> bool:
    """TCP_NODELAY on ``host``'s SSH connection, if it has one open (other connectors: nothing to do)."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is not None and no_delay(transport.sock)


class NoDelayOnConnect(BaseStateCallback):
    """pyinfra's own connection callback: a host connected later in the run (a cluster member another host's
    step reaches) sends at once too."""

    @staticmethod
    def host_connect(state, host):
        host_no_delay(host)


def install(state=None) -> None:
    """For the run in progress: every SSH connection open now sends at once, and every one opened later (the
    callback). pyinfra loads the deploy code once it has connected (CLI), so importing ``deploys`` does it
    before the first fact or command; an API run calls it with its state. Replaces nothing in pyinfra."""
    if state is None:
        state = ctx_state.get() if ctx_state.isset() else None
    if state is None or not getattr(state, "initialised", False):
        return  # not a run (an import by a test or a tool)
    if not any(isinstance(h, NoDelayOnConnect) for h in state.callback_handlers):
        state.add_callback_handler(NoDelayOnConnect())
    for host in state.inventory:
        host_no_delay(host)
