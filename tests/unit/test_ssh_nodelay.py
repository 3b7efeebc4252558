"""deploys/run/ssh_nodelay.py on real sockets: a TCP socket gets TCP_NODELAY, anything else is left alone."""

import socket

import pytest
from pyinfra.connectors.ssh import SSHConnector

from deploys.run.ssh_nodelay import no_delay


@pytest.fixture
def tcp_pair():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    yield client
    for s in (client, peer, server):
        s.close()


def test_a_tcp_socket_sends_without_delay(tcp_pair):
    assert tcp_pair.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0, "a new socket has Nagle on"
    assert no_delay(tcp_pair) is True
    assert tcp_pair.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_a_socket_that_is_not_tcp_is_left_alone():
    a, b = socket.socketpair()
    with a, b:
        assert no_delay(a) is False
    assert no_delay(object()) is False  # a ProxyCommand or jump-host channel


def test_install_replaces_nothing_and_registers_one_callback():
    """No pyinfra attribute is replaced: the socket option is set on open connections and from pyinfra's own
    connection callback, registered once however often the entry point runs."""
    import pyinfra.connectors.ssh as pyinfra_ssh
    from pyinfra.api import Config, Inventory, State

    from deploys.run.ssh_nodelay import NoDelayOnConnect, install

    assert SSHConnector._connect.__module__ == pyinfra_ssh.__name__
    state = State(Inventory((["@local"], {})), Config())
    install(state)
    install(state)
    assert sum(isinstance(h, NoDelayOnConnect) for h in state.callback_handlers) == 1
    install()  # not in a run: nothing to do, no error
