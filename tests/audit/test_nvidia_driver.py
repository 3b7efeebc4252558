"""Audit of the NVIDIA driver: branch installed, held three ways, other branches unreachable, loaded = installed.

Expected values come from the inventory's typed config; the host is read with plain dpkg/apt/cat commands.
"""

import re

import pytest

PIN_FILE = "/etc/apt/preferences.d/90-inference-nodes-nvidia-driver"
UNATTENDED_FILE = "/etc/apt/apt.conf.d/51inference-nodes-nvidia-driver"
DRIVER_NAME = re.compile(r"^(nvidia-|libnvidia-|cuda-drivers|xserver-xorg-video-nvidia)")


def _driver_packages(host) -> dict[str, str]:
    out = host.check_output("dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\\n'")
    pkgs = {}
    for line in out.splitlines():
        status, name, version = line.split("|")
        if status[1:2] == "i" and DRIVER_NAME.match(name) and re.match(r"^\d{3}\.", version):
            pkgs[name] = version
    return pkgs


def _installs_packages(node) -> bool:
    return node.cfg.nvidia_driver_source != "preinstalled"


def test_driver_packages_on_the_branch(node):
    if not _installs_packages(node):
        pytest.skip("nvidia_driver_source preinstalled: the driver is not managed by dpkg here")
    pkgs = _driver_packages(node.host)
    for name in node.cfg.driver_packages:
        assert name in pkgs, f"{name} not installed"
    off = {n: v for n, v in pkgs.items() if not v.startswith(node.cfg.nvidia_driver_branch + ".")}
    assert off == {}, f"driver packages of another branch installed: {off}"


def test_driver_packages_held(node):
    held = set(node.host.check_output("apt-mark showhold").split())
    installed = set(_driver_packages(node.host))
    if _installs_packages(node):
        assert installed, "no driver package installed"
    missing = sorted(installed - held)
    assert missing == [], f"not held: {missing}"


def test_kernel_held_with_its_nvidia_modules(node):
    hold = node.cfg.nvidia_kernel_hold
    if not hold:
        pytest.skip("nvidia_kernel_hold unset: the kernel may move")
    release = node.host.check_output("uname -r").strip() if hold == "running" else hold
    held = set(node.host.check_output("apt-mark showhold").split())
    installed = node.host.check_output(
        f"dpkg-query -W -f='${{db:Status-Abbrev}} ${{Package}}\\n' 'linux-*-{release}' 2>/dev/null || true")
    built_for = {line.split()[1] for line in installed.splitlines() if line[1:2] == "i"}
    assert f"linux-image-{release}" in built_for, f"no linux-image-{release} installed"
    assert sorted(built_for - held) == [], f"kernel {release}: not held"


def test_other_branches_are_not_candidates(node):
    branch = node.cfg.nvidia_driver_branch
    assert node.host.file(PIN_FILE).contains(f"^Pin: version {branch}\\.\\*$")
    for name in _driver_packages(node.host):
        policy = node.host.check_output(f"apt-cache policy {name}")
        candidate = re.search(r"Candidate: (\S+)", policy).group(1)
        assert candidate.startswith(branch + "."), f"{name}: candidate {candidate}"


def test_dist_upgrade_leaves_the_driver_alone(node):
    sim = node.host.check_output("apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    moved = [line for line in sim.splitlines() if line.startswith(("Inst ", "Remv ")) and DRIVER_NAME.match(line.split()[1])]
    assert moved == []


def test_unattended_upgrades_skip_the_driver(node):
    f = node.host.file(UNATTENDED_FILE)
    assert f.is_file and f.mode == 0o644
    for pattern in ('"nvidia-";', '"libnvidia-";', '"cuda-drivers";'):
        assert pattern in f.content_string


def test_nouveau_blacklisted(node):
    if not _installs_packages(node):
        pytest.skip("preinstalled driver: its OS image owns the modprobe configuration")
    assert node.host.file("/etc/modprobe.d/blacklist-nouveau.conf").contains("^blacklist nouveau$")


def test_loaded_module_is_the_installed_driver(node):
    root = node.cfg.nvidia_module_root.rstrip("/")
    loaded = node.host.check_output(f"cat {root}/sys/module/nvidia/version").strip()
    assert loaded.startswith(node.cfg.nvidia_driver_branch + "."), f"loaded module {loaded}"
    smi = node.host.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert smi.rc == 0, f"nvidia-smi failed: {smi.stdout.strip()} {smi.stderr.strip()}"
    assert {v.strip() for v in smi.stdout.splitlines() if v.strip()} == {loaded}


def test_every_gpu_the_service_uses_is_visible(node):
    out = node.host.check_output("nvidia-smi --query-gpu=index --format=csv,noheader")
    visible = {int(line.split(",")[0]) for line in out.splitlines() if line.strip()}
    assert set(node.cfg.gpu_indices) <= visible, f"gpu_indices {node.cfg.gpu_indices}, visible {sorted(visible)}"
