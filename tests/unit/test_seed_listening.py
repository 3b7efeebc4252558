"""The seed daemon's listen wait (files/model_snapshot/seed_listening.py) on real sockets, and as the node runs it
(`python3 -c` with the file's text, as deploys/model/fanout.py sends it)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from deploys.model.fanout import SEED_LISTENING
from files import helper_text
from files.model_snapshot.seed_listening import listening


def _listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock, sock.getsockname()[1]


def _free_port() -> int:
    sock, port = _listener()
    sock.close()
    return port


def test_a_listening_daemon_whose_unit_stays_up_serves():
    sock, port = _listener()
    with sock:
        assert listening("127.0.0.1", port, lambda: True, settle_s=0)


def test_a_daemon_that_binds_and_then_dies_does_not_serve():
    sock, port = _listener()
    states = iter([False])  # asked once, after the connection succeeded
    with sock:
        assert not listening("127.0.0.1", port, lambda: next(states), settle_s=0)


def test_nothing_listening_gives_up_at_once_when_the_unit_is_gone_else_after_its_tries():
    port = _free_port()
    start = time.monotonic()
    assert not listening("127.0.0.1", port, lambda: False)
    assert time.monotonic() - start < 1
    asked = []
    assert not listening("127.0.0.1", port, lambda: asked.append(1) or True, tries=3)
    assert len(asked) == 3


def test_the_node_runs_the_files_text_and_names_address_and_unit():
    proc = subprocess.run([sys.executable, "-c", helper_text(SEED_LISTENING), "127.0.0.1", str(_free_port()),
                           "inference-nodes-no-such-unit"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "cannot serve peers on 127.0.0.1:" in proc.stderr and "inference-nodes-no-such-unit is not running" in proc.stderr
