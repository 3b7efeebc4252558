"""`hub` mode's client: the pinned huggingface_hub in a venv on the node, from wheels the control node downloads
exactly as files/model_snapshot/hub-client.lock pins them (deploys/model/hub_lock.py) and pushes (nodes need no index).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess

import gevent.lock
from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand

from deploys.run.reads import operation, read
from deploys.model import hub_lock
from deploys.ops import ControlNodeError, fail_host
from facts.model import HubClient, NodePython

NODE_WHEELS = "/var/cache/inference-nodes/wheels"
HUB_VERSION = importlib.metadata.version("huggingface_hub")  # pinned in pyproject.toml
HUB_LOCK_NAME = os.path.basename(hub_lock.LOCK)  # pushed beside the wheels, kept in the venv

# one lock per wheel cache directory, process-wide like the directory (not run state)
_wheel_dir_locks: dict[str, gevent.lock.Semaphore] = {}


def control_wheels(pyver: str, machine: str) -> list[str]:
    """The wheels of huggingface_hub and its dependencies for the node's Python and CPU, exactly as the lock
    pins them (files/model_snapshot/hub-client.lock: versions and sha256, deploys/model/hub_lock.py), downloaded
    once per (lock, python, arch) into a control-node cache. A cached wheel whose hash is not in the lock is
    refused."""
    lock_id = hub_lock.sha256(hub_lock.LOCK)[:12]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                         "inference-nodes", "wheels", f"cp{pyver}-{machine}-hf{HUB_VERSION}-{lock_id}")
    with _wheel_dir_locks.setdefault(cache, gevent.lock.Semaphore()):
        if not os.path.exists(os.path.join(cache, ".complete")):
            os.makedirs(cache, exist_ok=True)
            cmd = hub_lock.download_command(pyver, machine, cache, "--require-hashes", "-r", hub_lock.LOCK)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise ControlNodeError(f"pip download for cp{pyver}/{machine} failed: {proc.stderr.strip()[-400:]}")
            open(os.path.join(cache, ".complete"), "w").close()
    wheels = sorted(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".whl"))
    allowed = hub_lock.lock_hashes()
    bad = [os.path.basename(w) for w in wheels if hub_lock.sha256(w) not in allowed]
    if bad:
        raise ControlNodeError(f"wheel(s) in {cache} not in {hub_lock.LOCK} (refused): {', '.join(bad)}")
    return wheels


def node_install_command(pip: str, wheels: str) -> list[str]:
    """What the node runs: only the locked wheels from ``wheels``, each checked against the lock's hashes."""
    return [pip, "install", "-q", "--require-hashes", "--no-index", "--find-links", wheels,
            "-r", f"{wheels}/{HUB_LOCK_NAME}"]


@operation()
def hub_client_installed(venv: str):
    """The pinned huggingface_hub in ``venv`` on the node, installed with --require-hashes from the wheels the
    control node pushes; the lock it was installed from is kept in the venv, so a new lock reinstalls.

    + venv: the venv path on the node
    """
    have = read(host, HubClient, venv=venv, lock_name=HUB_LOCK_NAME)
    if (have["version"], have["lock_sha256"]) == (HUB_VERSION, hub_lock.sha256(hub_lock.LOCK)):
        host.noop(f"huggingface_hub {HUB_VERSION} in {venv}, from the current lock")
        return
    node = read(host, NodePython)
    pyver, machine = node["version"], node["machine"]
    if pyver not in hub_lock.PYTHONS or machine not in hub_lock.MACHINES:
        yield fail_host(f"{host.name}: the hub client lock has no wheels for Python {pyver[0]}.{pyver[1:]} on "
                        f"{machine}: add it to deploys/model/hub_lock.py and run `python -m deploys.model.hub_lock`")
        return
    try:
        wheels = control_wheels(pyver, machine)
    except ControlNodeError as e:
        yield fail_host(f"{host.name}: {e}")
        return
    yield StringCommand("rm", "-rf", NODE_WHEELS, "&&", "mkdir", "-p", NODE_WHEELS)
    for wheel in [*wheels, hub_lock.LOCK]:
        yield FileUploadCommand(wheel, f"{NODE_WHEELS}/{os.path.basename(wheel)}")
    yield StringCommand("python3", "-m", "venv", "--clear", QuoteString(venv))  # the schema keeps it under /opt/inference-nodes/
    yield StringCommand(*map(QuoteString, node_install_command(f"{venv}/bin/pip", NODE_WHEELS)))
    yield StringCommand("cp", f"{NODE_WHEELS}/{HUB_LOCK_NAME}", QuoteString(f"{venv}/{HUB_LOCK_NAME}"))
