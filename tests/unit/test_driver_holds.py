"""DGX OS's preinstalled driver on GB10: what the kernel hold holds, and the three versions that must agree
(loaded module, the running kernel's NVIDIA modules package, userspace), on fact outputs in the facts'
formats (tests/unit/fixtures/nvidia: gb10-shaped is hand-made after public DGX OS listings, real-h200 captured)."""

import runpy
from pathlib import Path

import pytest

from deploys.preflight import driver_column, driver_problems
from deploys.schema import NvidiaDriverKeys
from facts.nvidia import KernelPackages, NvidiaDriverPackages, driver_state, kernel_hold_set, modules_for

FIX = Path(__file__).parent / "fixtures" / "nvidia"
RUNNING = "6.17.0-1014-nvidia"


def _kernel(path: Path = FIX / "gb10-shaped" / "kernel-packages.txt") -> dict:
    return KernelPackages().process(path.read_text().splitlines())


def _userspace(version: str = "580.142-0ubuntu0.24.04.1") -> dict:
    lines = (FIX / "gb10-shaped" / "dpkg-driver-packages.txt").read_text().replace("580.142-0ubuntu0.24.04.1", version)
    return NvidiaDriverPackages().process(lines.splitlines())


def test_kernel_fact_reads_running_kernel_installed_packages_and_the_modules_driver():
    kernel = _kernel()
    assert kernel["running"] == RUNNING
    pkgs = kernel["packages"]
    assert "linux-kernel-headers" not in pkgs  # "un": known to dpkg, not installed
    assert "linux-modules-nvidia-580-open-6.11.0-1016-nvidia" not in pkgs  # "rc": only its config is left
    assert "linux-libc-dev" in pkgs  # the :arm64 qualifier is dropped
    mods = pkgs["linux-modules-nvidia-580-open-6.17.0-1014-nvidia"]
    assert mods["version"] == "6.17.0-1014.14+1" and mods["driver"] == "580.142"
    assert "linux-image-6.17.0-1014-nvidia" in mods["depends"] and "linux-image-unsigned-6.17.0-1014-nvidia" in mods["depends"]
    # the flavour metapackage pins the driver too, but it is not the modules of one kernel
    assert pkgs["linux-modules-nvidia-580-open-nvidia-hwe-24.04"]["driver"] is None
    assert modules_for(kernel, RUNNING) == ("linux-modules-nvidia-580-open-6.17.0-1014-nvidia", "580.142")


def test_hold_set_is_the_running_kernel_its_nvidia_modules_and_the_metapackages_that_would_move_it():
    assert kernel_hold_set(_kernel(), RUNNING) == [
        "linux-headers-6.17.0-1014-nvidia",
        "linux-headers-nvidia-hwe-24.04",
        "linux-image-6.17.0-1014-nvidia",
        "linux-image-nvidia-hwe-24.04",
        "linux-modules-6.17.0-1014-nvidia",
        "linux-modules-nvidia-580-open-6.17.0-1014-nvidia",
        "linux-modules-nvidia-580-open-nvidia-hwe-24.04",
        "linux-nvidia-hwe-24.04",  # through the image and headers metapackages
        "linux-signatures-nvidia-6.17.0-1014-nvidia",
    ]
    # an older installed kernel is not held; a kernel the node does not have gives nothing to hold
    assert "linux-image-6.11.0-1016-nvidia" in kernel_hold_set(_kernel(), "6.11.0-1016-nvidia")
    assert kernel_hold_set(_kernel(), "6.17.0-1021-nvidia") == []


def test_real_host_without_kernel_packages_has_nothing_to_hold():
    kernel = _kernel(FIX / "real-h200" / "kernel-packages.txt")
    assert kernel == {"running": "6.18.44-fc-v973-gpu", "packages": {
        "linux-libc-dev": {"version": "6.8.0-85.85", "depends": [], "driver": None}}}
    assert kernel_hold_set(kernel, kernel["running"]) == []


def test_all_three_equal_is_ok():
    state = driver_state(_userspace(), {"version": "580.142"}, _kernel())
    assert state["state"] == "ok" and state["modules"] == "580.142"


def test_userspace_upgraded_without_the_modules_package_differs_and_no_reboot_fixes_it():
    # unattended-upgrades moved userspace to 580.159.03; the kernel's modules package still carries 580.142
    state = driver_state(_userspace("580.159.03-0ubuntu0.24.04.1"), {"version": "580.142"}, _kernel())
    assert state["state"] == "packages_differ"
    assert state["reason"] == ("linux-modules-nvidia-580-open-6.17.0-1014-nvidia carries module 580.142, userspace "
                               "driver 580.159.03 is installed, module 580.142 is loaded")
    assert driver_column(state).startswith("580.142 (PACKAGES DIFFER: linux-modules-nvidia-580-open-6.17.0-1014")


def test_loaded_module_differs_but_packages_agree_is_a_reboot():
    state = driver_state(_userspace(), {"version": "580.126.09"}, _kernel())
    assert state["state"] == "reboot_required"
    assert "REBOOT REQUIRED" in driver_column(state)


def test_booted_into_a_kernel_without_its_modules_package():
    kernel = _kernel()
    kernel["running"] = "6.17.0-1021-nvidia"  # a kernel upgrade came without linux-modules-nvidia for it
    _with_newer_kernel(kernel, "6.17.0-1021-nvidia", None)
    state = driver_state(_userspace(), {"version": None}, kernel)
    assert state["state"] == "packages_differ"
    assert "no linux-modules-nvidia package for the running kernel 6.17.0-1021-nvidia (installed for " \
           "6.17.0-1014-nvidia)" in state["reason"]
    # a DKMS-built module that is loaded is not second-guessed
    assert driver_state(_userspace(), {"version": "580.142"}, kernel)["state"] == "ok"


def _with_newer_kernel(kernel: dict, release: str, driver: str | None) -> dict:
    """``kernel`` plus an installed, not booted ``release`` (and its NVIDIA modules package carrying ``driver``)."""
    pkgs = kernel["packages"]
    pkgs[f"linux-image-{release}"] = {"version": "6.17.0-1021.21", "depends": [], "driver": None}
    if driver:
        pkgs[f"linux-modules-nvidia-580-open-{release}"] = {
            "version": "6.17.0-1021.21+1", "depends": [f"linux-image-{release}"], "driver": driver}
    return kernel


def test_an_upgrade_that_brought_a_newer_kernel_with_matching_modules_is_a_reboot_naming_that_kernel():
    kernel = _with_newer_kernel(_kernel(), "6.17.0-1021-nvidia", "580.159.03")
    state = driver_state(_userspace("580.159.03-0ubuntu0.24.04.1"), {"version": "580.142"}, kernel)
    assert state["state"] == "reboot_required"
    assert state["reason"] == (
        "the running kernel 6.17.0-1014-nvidia has linux-modules-nvidia-580-open-6.17.0-1014-nvidia with module "
        "580.142, userspace driver 580.159.03 is installed; the next boot starts kernel 6.17.0-1021-nvidia, whose "
        "linux-modules-nvidia-580-open-6.17.0-1021-nvidia carries 580.159.03: a reboot into 6.17.0-1021-nvidia "
        "loads it")
    # the newer kernel's modules are another driver again, or it has none: no reboot fixes that
    for driver in ("580.142", None):
        kernel = _with_newer_kernel(_kernel(), "6.17.0-1021-nvidia", driver)
        state = driver_state(_userspace("580.159.03-0ubuntu0.24.04.1"), {"version": "580.142"}, kernel)
        assert state["state"] == "packages_differ", driver
    # an older kernel with matching modules is not what the next boot starts
    kernel = _kernel()
    kernel["packages"]["linux-modules-nvidia-580-open-6.11.0-1016-nvidia"] = {
        "version": "6.11.0-1016.16+1", "depends": [], "driver": "580.159.03"}
    state = driver_state(_userspace("580.159.03-0ubuntu0.24.04.1"), {"version": "580.142"}, kernel)
    assert state["state"] == "packages_differ"


def test_preflight_refuses_differing_packages_only_for_a_preinstalled_driver():
    state = driver_state(_userspace("580.159.03-0ubuntu0.24.04.1"), {"version": "580.142"}, _kernel())
    (problem,) = driver_problems(NvidiaDriverKeys(nvidia_driver_source="preinstalled"), state)
    assert problem.startswith("DRIVER PACKAGES DIFFER (linux-modules-nvidia-580-open-6.17.0-1014-nvidia carries")
    assert "a reboot cannot fix it" in problem
    assert driver_problems(NvidiaDriverKeys(), state) == []  # the CUDA-repo deploy installs, then checks
    ok = driver_state(_userspace(), {"version": "580.142"}, _kernel())
    assert driver_problems(NvidiaDriverKeys(nvidia_driver_source="preinstalled"), ok) == []


@pytest.mark.parametrize("profile", ["gb10_dspark", "gb10_mtp"])
def test_gb10_profiles_use_the_preinstalled_driver_and_hold_the_running_kernel(profile):
    data = runpy.run_path(f"inventories/group_data/{profile}.py")
    keys = NvidiaDriverKeys(**{k: v for k, v in data.items() if k in NvidiaDriverKeys.model_fields})
    assert keys.nvidia_driver_source == "preinstalled" and keys.nvidia_kernel_hold == "running"
    assert keys.driver_packages == [] and data["node_arch"] == "aarch64"


@pytest.mark.parametrize("value,ok", [("running", True), ("6.17.0-1014-nvidia", True), ("latest", False),
                                      ("6.8.0 -1", False)])
def test_kernel_hold_values(value, ok):
    if ok:
        assert NvidiaDriverKeys(nvidia_kernel_hold=value).nvidia_kernel_hold == value
    else:
        with pytest.raises(ValueError):
            NvidiaDriverKeys(nvidia_kernel_hold=value)


