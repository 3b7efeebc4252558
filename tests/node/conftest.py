"""Node tier: real sandbox nodes (systemd-nspawn, tests/sandbox/node.sh) booted once per session.

Outside CI the tier is skipped when this machine cannot boot nodes (not root, no apt); under CI=true it
fails instead, so a CI run can never pass without it.
"""

from __future__ import annotations

import importlib

importlib.import_module("pyinfra_cli")  # gevent's monkey-patching first, before anything imports ssl (requests)

import contextlib  # noqa: E402
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.lab_endpoint import make_lab_endpoint_dir
from tests.sandbox.nodes import sandbox_nodes

make_lab_endpoint_dir()  # the lab inventory's profile A, read by the Quadlet generator checks (test_50)

NODE_SH = "tests/sandbox/node.sh"
INVENTORY = "inventories/sandbox.py"
PYINFRA = os.path.join(os.path.dirname(sys.executable), "pyinfra")
SANDBOX_DIR = os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox")
SAVED = ".saved-by-a-node-test"  # a control-node file's copy while a test changes it (restored_afterwards)


@contextlib.contextmanager
def restored_afterwards(path: str):
    """A control-node file under $SANDBOX_DIR (a client key file, say) that the test changes comes back as it was
    when the block ends, and at the next session's start if this run is killed first (CI's time limit): its copy
    waits beside it, written 0600 from the start (it may hold secrets)."""
    saved = path + SAVED
    with open(path, "rb") as src:
        data = src.read()
    fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    try:
        yield
    finally:
        os.replace(saved, path)


def restore_what_a_killed_run_changed(root: str = SANDBOX_DIR) -> list[str]:
    """Put back every file a killed session's test left changed (its saved copy, two levels under ``root``)."""
    restored = []
    for saved in glob.glob(f"{root}/*/*{SAVED}") + glob.glob(f"{root}/*/*/*{SAVED}"):
        os.replace(saved, saved[: -len(SAVED)])
        restored.append(saved[: -len(SAVED)])
    return restored


def _cannot_boot() -> str | None:
    if os.geteuid() != 0:
        return "sandbox nodes need root"
    if not shutil.which("systemd-nspawn") and not shutil.which("apt-get"):
        return "no systemd-nspawn and no apt-get to install it"
    return None


@pytest.fixture(scope="session")
def sandbox():
    reason = _cannot_boot()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"node tier cannot run under CI: {reason}")
        pytest.skip(reason)
    for path in restore_what_a_killed_run_changed():
        print(f"\n[sandbox] {path}: restored as it was before a killed run's test changed it")
    nodes = sandbox_nodes(INVENTORY)
    reuse = os.environ.get("SANDBOX_REUSE") == "1" and os.environ.get("CI") != "true"
    if not reuse:  # fresh nodes: a leftover `make demo` node is not (SANDBOX_REUSE=1 keeps a demo, for debugging)
        subprocess.run([NODE_SH, "down-all"], check=False)
    try:
        for name, port, gpus, fabric, driver in nodes:
            subprocess.run([NODE_SH, "up", name, str(port), str(gpus), fabric, driver], check=True)
        subprocess.run([sys.executable, "-m", "tests.sandbox.nodes", "--manifests"], check=True)
        yield [name for name, *_ in nodes]
    finally:
        if not reuse:  # throwaway nodes: no clean halt to wait for (up to 30 s a node), their rootfs goes anyway
            subprocess.run([NODE_SH, "down-all"], check=False, env={**os.environ, "FAST_DOWN": "1"})


def pyinfra(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the pyinfra CLI exactly as an admin would, against the sandbox inventory (a converge that starts a
    service waits for it to serve: a real vLLM loads and compiles first, several at once on 2 cores)."""
    cmd = [PYINFRA, "-y", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{failure_excerpt(proc.stderr)}"
                             f"{failed_units_told(proc.stderr)}")
    return proc


FAILED_UNIT = re.compile(r'\[([\w.-]+)\] +See "systemctl status ([\w@.-]+)"')


def failed_units_told(stderr: str) -> str:
    """For each unit a failed run names ('See "systemctl status X"'), its node's own account: the unit's state and
    its journal of this boot without vLLM's chatter (what CI keeps of a failure the run's words alone cannot explain)."""
    out = []
    for name, unit in dict.fromkeys(FAILED_UNIT.findall(stderr)):
        told = on_node(name, f"systemctl status {unit} --no-pager -n 0; journalctl -b --no-pager -o short-precise "
                             f"-u {unit} | grep -v -E 'APIServer pid|EngineCore pid|Worker pid' | tail -40")
        out.append(f"\n\n{name}: {unit} as the node tells it:\n{told.stdout[-4000:]}")
    return "".join(out)


FAILURE_LINE = re.compile(r"\[[\w.-]+\] +(Error|Unexpected error)|^--> .*(error|failed)|Traceback \(most recent", re.I)


def failure_excerpt(stderr: str, before: int = 4, after: int = 40, tail: int = 2500) -> str:
    """What a failed run said about its failures: every error line with the lines around it (the operation's
    name before, the reason and journal after), then the run's last lines. A long run's tail alone may hold only
    the hosts that went on (CI once showed 6,000 characters of other hosts' successes and no reason)."""
    lines = stderr.splitlines()
    keep: set[int] = set()
    for i, line in enumerate(lines):
        if FAILURE_LINE.search(line):
            keep.update(range(max(0, i - before), min(len(lines), i + after)))
    shown, last = [], -2
    for i in sorted(keep):
        if i != last + 1:
            shown.append("[...]")
        shown.append(lines[i])
        last = i
    errors = "\n".join(shown)[:12000]
    return (f"the run's errors:\n{errors}\n\nthe run's end:\n" if shown else "") + stderr[-tail:]


def changed_operations(proc: subprocess.CompletedProcess) -> list[tuple[str, list[str]]]:
    """(operation, hosts) pairs that changed something, from pyinfra's --json results."""
    results = json.loads(proc.stdout)["results"]
    assert not results["failed_hosts"], results["failed_hosts"]
    return [(op["name"], op["success"]) for op in results["operations"] if op["success"]]


def inventory_copy(tmp_path, *edits: tuple[str, str]) -> str:
    """The sandbox inventory with each ``(old, new)`` text edit made (each ``old`` must be in it), written as
    ``tmp_path/sandbox.py`` (the same file-name group: the sandbox stand-ins apply) beside a link to the
    repo's group data, so pyinfra and the audit read the profiles as they read them for INVENTORY."""
    with open(INVENTORY) as f:
        text = f.read()
    for old, new in edits:
        assert old in text, f"{INVENTORY} no longer has {old!r}"
        text = text.replace(old, new)
    link = tmp_path / "group_data"
    if not link.is_symlink():
        os.symlink(os.path.abspath("inventories/group_data"), link)
    inventory = tmp_path / "sandbox.py"
    inventory.write_text(text)
    return str(inventory)


def on_node(name: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run([NODE_SH, "ssh", name, command], capture_output=True, text=True, timeout=120)


def wait_serving(nodes: list[str], timeout: float = 900, inventory: str = INVENTORY) -> None:
    """Until every node's service is active and every head answers /health (a real vLLM loads and compiles
    first, several at once on this machine's 2 cores)."""
    import time

    from deploys.inventory import inventory_configs, load_inventory
    from deploys.serving_gate import wait_ready

    configs = inventory_configs(load_inventory(inventory))
    t0 = time.monotonic()
    for name in nodes:
        cfg = configs[name]
        on_node(name, f"timeout {int(timeout)} systemctl is-active --wait {cfg.container_name}.service")
        if cfg.node_rank != 0:
            continue
        try:
            wait_ready(f"http://127.0.0.1:{cfg.api_port}", max(0.0, timeout - (time.monotonic() - t0)), interval=1.0)
        except TimeoutError:
            pass  # as before: the caller's own checks say what is not serving
