"""The sandbox harness keeps this machine clean: its registry runs only while nodes are up and stops at
down-all (run for real against a throwaway SANDBOX_DIR, with a stand-in process as the registry)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

NODE_SH = os.path.join(os.path.dirname(__file__), "..", "sandbox", "node.sh")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_down_all_stops_the_sandbox_registry_and_the_stand_in_servers(tmp_path):
    (tmp_path / "registry").mkdir()
    procs = {name: subprocess.Popen(["sleep", "300"]) for name in ("registry/pid", "hub.pid", "repo-server.pid")}
    for name, proc in procs.items():
        (tmp_path / name).write_text(f"{proc.pid}\n")
    proc = subprocess.run([NODE_SH, "down-all"], env={**os.environ, "SANDBOX_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for name, p in procs.items():
        p.wait(timeout=10)
        assert not _alive(p.pid), name
        assert not (tmp_path / name).exists(), name


def test_the_sandbox_registry_binds_loopback_and_the_package_service_is_kept_off():
    with open(NODE_SH) as f:
        text = f.read()
    assert "REGISTRY_ADDR=127.0.0.1:5000" in text
    assert "registry_package_off\n  return $rc" in text  # every `deps`, not only on first install
    for line in ("deb-systemd-helper disable docker-registry.service",
                 "ln -sfn /dev/null /etc/systemd/system/docker-registry.service",
                 "update-rc.d docker-registry disable"):
        assert line in text


def test_a_running_registry_package_daemon_would_show_as_a_listener_on_every_interface():
    """What the node tier checks on this machine: no listener on :5000 except loopback (parsed here)."""
    from tests.unit.test_sandbox_harness import listeners_on

    table = ("  sl  local_address rem_address   st\n"
             "   0: 0100007F:1388 00000000:0000 0A\n"
             "   1: 00000000:1388 00000000:0000 0A\n"
             "   2: 0100007F:1F90 00000000:0000 01\n")
    assert listeners_on(5000, table) == ["127.0.0.1", "0.0.0.0"]


def listeners_on(port: int, proc_net_tcp: str) -> list[str]:
    """Addresses listening (state 0A) on ``port`` in a /proc/net/tcp table."""
    out = []
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        addr, p = fields[1].split(":")
        if fields[3] == "0A" and int(p, 16) == port:
            out.append(".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return out



KILLED_INSIDE = """
import os, signal, sys
from tests.node.conftest import restored_afterwards
with restored_afterwards(sys.argv[1]):
    open(sys.argv[1], "w").write("demo rotated-key\\n")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_control_node_file_a_node_test_changes_comes_back_even_after_a_killed_run(tmp_path):
    """The key rotation drill rewrites the sandbox's client key file: it comes back when the test ends, and a run
    killed inside it (CI's time limit) leaves a 0600 copy that the next session's start puts back."""
    from tests.node.conftest import SAVED, restore_what_a_killed_run_changed, restored_afterwards

    clients = tmp_path / "endpoint" / "clients"
    clients.parent.mkdir()
    clients.write_text("demo secret-key-1\n")
    clients.chmod(0o600)
    with restored_afterwards(str(clients)):
        assert oct((tmp_path / "endpoint" / f"clients{SAVED}").stat().st_mode & 0o777) == "0o600"
        clients.write_text("demo rotated-key\n")
    assert clients.read_text() == "demo secret-key-1\n"
    assert not (tmp_path / "endpoint" / f"clients{SAVED}").exists()
    # a run SIGKILLed inside the block: the copy stays, the file keeps the rotated key
    killed = subprocess.run([sys.executable, "-c", KILLED_INSIDE, str(clients)], capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert clients.read_text() == "demo rotated-key\n"
    assert restore_what_a_killed_run_changed(str(tmp_path)) == [str(clients)]
    assert clients.read_text() == "demo secret-key-1\n" and oct(clients.stat().st_mode & 0o777) == "0o600"
    assert restore_what_a_killed_run_changed(str(tmp_path)) == []
