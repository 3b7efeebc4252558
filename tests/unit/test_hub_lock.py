"""The hub mode's wheels come from the committed lock (files/model_snapshot/hub-client.lock) and nothing
else: the lock pins what pyproject.toml pins, the control node downloads every supported platform's wheels
with --require-hashes, and both pip on the control node and the node's install command refuse a wheel
whose hash is not in the lock. Runs the real pip against PyPI (skipped without it, except under CI)."""

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from deploys.model import hub_lock
from deploys.model.hub import HUB_LOCK_NAME, HUB_VERSION, control_wheels, node_install_command

REFUSED = "DO NOT MATCH THE HASHES"  # pip's message for a file whose sha256 is not in the requirements


def requirements(text: str) -> dict[str, list[str]]:
    """{name==version: [sha256, ...]} of a lock file."""
    pins: dict[str, list[str]] = {}
    for entry in re.sub(r"\\\n\s*", " ", text).splitlines():
        if entry.strip() and not entry.startswith("#"):
            pin, *hashes = entry.split()
            pins[pin] = [h.removeprefix("--hash=sha256:") for h in hashes]
    return pins


def test_lock_pins_every_package_with_hashes_and_the_pyproject_hub_version():
    pins = requirements(Path(hub_lock.LOCK).read_text())
    pyproject = (Path(hub_lock.ROOT) / "pyproject.toml").read_text()
    assert f'"huggingface-hub=={HUB_VERSION}"' in pyproject
    assert f"huggingface-hub=={HUB_VERSION}" in pins, "regenerate: python -m deploys.model.hub_lock"
    for pin, hashes in pins.items():
        assert re.fullmatch(r"[a-z0-9-]+==[^=\s]+", pin), pin
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), pin
    # the binary dependencies carry a wheel per supported platform: one per Python and CPU for pyyaml,
    # one per CPU for hf-xet (abi3)
    platforms = len(hub_lock.PYTHONS) * len(hub_lock.MACHINES)
    assert len(next(h for p, h in pins.items() if p.startswith("pyyaml=="))) == platforms
    assert len(next(h for p, h in pins.items() if p.startswith("hf-xet=="))) == len(hub_lock.MACHINES)


@pytest.fixture(scope="module")
def wheel_cache(tmp_path_factory):
    """XDG_CACHE_HOME for control_wheels, with every supported platform downloaded (the real pip)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg")))
        platforms = [(p, m) for p in hub_lock.PYTHONS for m in hub_lock.MACHINES]
        with ThreadPoolExecutor(len(platforms)) as pool:  # one pip each, side by side
            try:
                yield dict(zip(platforms, pool.map(lambda pm: control_wheels(*pm), platforms)))
            except RuntimeError as e:
                if os.environ.get("CI") or "hash" in str(e).lower():
                    raise
                pytest.skip(f"PyPI not reachable: {e}")


def test_control_node_downloads_exactly_the_locked_wheels_for_every_platform(wheel_cache):
    allowed = hub_lock.lock_hashes()
    pins = requirements(Path(hub_lock.LOCK).read_text())
    for (pyver, machine), wheels in wheel_cache.items():
        assert len(wheels) == len(pins), (pyver, machine)
        assert {hub_lock.sha256(w) for w in wheels} <= allowed
        yaml = next(os.path.basename(w) for w in wheels if os.path.basename(w).startswith("pyyaml-"))
        assert f"-cp{pyver}-" in yaml and machine in yaml


def test_a_wrong_hash_in_the_lock_is_refused_by_pip_download(wheel_cache, tmp_path):
    text = Path(hub_lock.LOCK).read_text()
    (good,) = requirements(text)[f"huggingface-hub=={HUB_VERSION}"]
    lock = tmp_path / "bad.lock"
    lock.write_text(text.replace(good, "0" * 64))
    cmd = hub_lock.download_command("312", "x86_64", str(tmp_path / "dl"), "--require-hashes", "-r", str(lock))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode != 0 and REFUSED in proc.stderr
    assert not any(p.name.startswith("huggingface_hub") for p in (tmp_path / "dl").glob("*"))


def node_dir(wheel_cache, tmp_path) -> Path:
    """What hub_client_installed pushes to the node: the wheels for this machine's Python and CPU, and the lock."""
    pyver, machine = f"{sys.version_info[0]}{sys.version_info[1]}", os.uname().machine
    if (pyver, machine) not in wheel_cache:
        pytest.skip(f"this machine (cp{pyver}/{machine}) is no supported node platform")
    d = tmp_path / "wheels"
    d.mkdir()
    for w in wheel_cache[pyver, machine]:
        shutil.copy(w, d)
    shutil.copy(hub_lock.LOCK, d / HUB_LOCK_NAME)
    return d


def node_install(d: Path, target: Path) -> subprocess.CompletedProcess:
    pip = str(Path(sys.executable).parent / "pip")
    cmd = [*node_install_command(pip, str(d)), "--no-compile", "--target", str(target)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_node_installs_the_locked_wheels_offline(wheel_cache, tmp_path):
    proc = node_install(node_dir(wheel_cache, tmp_path), tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / f"huggingface_hub-{HUB_VERSION}.dist-info").is_dir()


def test_a_tampered_wheel_is_refused_by_the_control_node_and_by_the_node(wheel_cache, tmp_path):
    pyver, machine = next(iter(wheel_cache))
    cached = next(w for w in wheel_cache[pyver, machine] if os.path.basename(w).startswith("huggingface_hub-"))
    original = Path(cached).read_bytes()
    try:
        Path(cached).write_bytes(original + b"\0")  # a changed wheel in the control-node cache
        with pytest.raises(RuntimeError, match=rf"not in .*{HUB_LOCK_NAME} \(refused\): huggingface_hub-"):
            control_wheels(pyver, machine)
    finally:
        Path(cached).write_bytes(original)
    d = node_dir(wheel_cache, tmp_path)
    pushed = next(d.glob("huggingface_hub-*.whl"))
    pushed.write_bytes(pushed.read_bytes() + b"\0")  # a wheel changed on the way or on the node
    proc = node_install(d, tmp_path / "site")
    assert proc.returncode != 0 and REFUSED in proc.stderr
    assert not (tmp_path / "site").exists() or not any((tmp_path / "site").iterdir())


def test_a_package_missing_from_the_lock_is_refused_by_the_node(wheel_cache, tmp_path):
    d = node_dir(wheel_cache, tmp_path)
    lock = d / HUB_LOCK_NAME
    lock.write_text(re.sub(r"(?m)^tqdm==.*(\n\s+--hash.*)*\n", "", lock.read_text()))
    proc = node_install(d, tmp_path / "site")
    assert proc.returncode != 0 and "tqdm" in proc.stderr
