"""Every shell command in the README runs here exactly as written (or is one of the two runners), and does what its
line says: a README command that does nothing, or something else, fails CI.

The lab's commands run in a copy of the repository whose `inventories/lab.py` has the shipped groups and names,
with every host pointed at a local listener that counts connections (no lab in CI): which hosts a command reached,
its exit status and its words are what the README promises."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.unit.test_limit import B, _lab_on_listeners
from tests.unit.test_profile_gaps import Listener

A, C = ["rtx-pro-a.lab.example"], ["spark-c0.lab.example", "spark-c1.lab.example"]
GAP = "spark-c0.lab.example: key 'model_revision' = <missing>"


def readme_commands(text: str) -> list[str]:
    """The commands of the README's ```sh blocks, comments dropped."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, flags=re.M | re.S):
        for line in block.splitlines():
            command = line.split("  #", 1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


# The runners: `make test` is what CI runs (.ci/run) on every landing; `make demo` is the node tier's steps
# (boot, this converge, this audit) for a person, checked below to be exactly those.
RUNNERS = {"make test", "make demo"}

# command -> (exit status, hosts it reaches, words it must print)
EXPECTED = {
    ".venv/bin/python -m deploys.validate inventories/lab.py": (1, [], [GAP]),
    ".venv/bin/python -m deploys.validate inventories/lab.py --limit gb10_dspark":
        (0, [], [f"{B[0]}: valid (cluster gb10-dspark, rank 0)", f"{B[1]}: valid (cluster gb10-dspark, rank 1)"]),
    ".venv/bin/pyinfra inventories/lab.py deploys/all.py": (1, [], [GAP]),
    ".venv/bin/pyinfra -y inventories/lab.py deploys/all.py": (1, [], [GAP]),
    ".venv/bin/pyinfra -y inventories/lab.py deploys/all.py --limit gb10-dspark": (1, B, [f"[{B[0]}]", f"[{B[1]}]", "No hosts remaining"]),
    ".venv/bin/pytest tests/audit --inventory inventories/lab.py --limit gb10-dspark": (1, B, [f"[{B[0]}]", f"[{B[1]}]"]),
    ".venv/bin/pyinfra inventories/lab.py exec -- uptime": (1, sorted(A + B + C), [GAP, "exec runs anyway"]),
    # the cluster's head alone is read; a listener that is no SSH server is a head not reached
    ".venv/bin/python -m deploys.lab_status inventories/lab.py --limit gb10-dspark":
        (1, [B[0]], [f"gb10-dspark  {B[0]}  unreachable", f"[{B[0]}]   SSH error"]),
    # the waves alone: no host is reached, nothing is written
    ".venv/bin/python -m deploys.rollout inventories/lab.py --limit gb10-dspark --plan": (0, [], ["wave 0 (canary): gb10-dspark"]),
    # no rollout of this inventory is recorded on this control node: nothing to take back, no host reached
    ".venv/bin/python -m deploys.rollout inventories/lab.py --limit gb10-dspark --abort": (2, [], ["no rollout to abort"]),
}


@pytest.fixture(scope="module")
def lab_copy(tmp_path_factory):
    """The repository as a command sees it, its lab's hosts on listeners."""
    root = tmp_path_factory.mktemp("repo")
    names = [*A, *B, *C]
    listeners = {name: Listener() for name in names}
    _lab_on_listeners(root, listeners)
    for name in ("deploys", "facts", "files", "config.py", "pyproject.toml"):
        os.symlink(os.path.abspath(name), root / name)
    os.symlink(os.path.dirname(os.path.dirname(sys.executable)), root / ".venv")
    shutil.copytree("tests", root / "tests", ignore=shutil.ignore_patterns("__pycache__", "results"))
    yield root, listeners
    for listener in listeners.values():
        listener.sock.close()


def test_the_readme_has_no_command_no_test_runs():
    commands = readme_commands(open("README.md").read())
    assert {"make test", "make demo"} <= set(commands)
    unrun = [c for c in commands if c not in EXPECTED and c not in RUNNERS]
    assert not unrun, f"README commands no test runs (add them to EXPECTED with what they must do): {unrun}"
    assert "make test" in open(".ci/run").read()


def test_make_demo_runs_the_node_tiers_converge_and_audit():
    recipe = subprocess.run(["make", "-n", "demo", "BIN=.venv/bin"], capture_output=True, text=True, timeout=60)
    assert recipe.returncode == 0, recipe.stderr
    assert ".venv/bin/pyinfra -y inventories/sandbox.py deploys/all.py" in recipe.stdout
    assert "AUDIT_INVENTORY=inventories/sandbox.py .venv/bin/python -m pytest -q tests/audit" in recipe.stdout


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_a_readme_command_does_what_its_line_says(command, lab_copy):
    assert command in readme_commands(open("README.md").read()), "no longer in the README: drop it here"
    root, listeners = lab_copy
    rc, reached_hosts, words = EXPECTED[command]
    before = {name: listener.accepted for name, listener in listeners.items()}
    env = {k: v for k, v in os.environ.items() if k not in ("AUDIT_INVENTORY", "PYTEST_ADDOPTS")}
    proc = subprocess.run(shlex.split(command), cwd=root, capture_output=True, text=True, timeout=300, env=env,
                          stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    reached = sorted(name for name, listener in listeners.items() if listener.accepted > before[name])
    assert proc.returncode == rc, out[-3000:]
    assert reached == sorted(reached_hosts), out[-3000:]
    for word in words:
        assert word in out, out[-3000:]
