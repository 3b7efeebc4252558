"""NVIDIA fact parsers on the raw outputs captured on a real GPU host (tests/unit/fixtures/nvidia/real-h200:
Ubuntu 24.04.3, H200, driver 580.159.04 open, driver outside dpkg) and a GB10-shaped [N/A] output."""

from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from deploys.preflight import driver_column, gpu_column, problems_for
from deploys.schema import NodeConfig
from facts.apt import KeyringFingerprints
from facts.nvidia import (
    NvidiaDriverPackages,
    NvidiaKernelModule,
    NvidiaSmiGpus,
    driver_state,
    upstream_version,
)

FIX = Path(__file__).parent / "fixtures" / "nvidia"
REAL = FIX / "real-h200"
MARK = "##inference-nodes:"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def smi_output(path: Path, rc: int = 0) -> list[str]:
    return [*lines(path), f"{MARK}rc={rc}"]


def module_output(sys_file: Path | None, proc_file: Path | None) -> list[str]:
    return [f"{MARK}sys", *(lines(sys_file) if sys_file else []), f"{MARK}proc", *(lines(proc_file) if proc_file else [])]


def test_real_h200_gpus():
    smi = NvidiaSmiGpus().process(smi_output(REAL / "nvidia-smi-query.csv"))
    assert smi == {"error": None, "gpus": [{
        "index": 0, "name": "NVIDIA H200", "uuid": "GPU-b22937f2-0a6b-5401-52c5-9e6eef182257",
        "memory_mib": 143771, "compute_cap": "9.0", "pci_bus_id": "00000000:00:06.0", "driver_version": "580.159.04",
    }]}
    # the same numbers nvidia-smi's XML report gives
    xml = (REAL / "nvidia-smi-q.xml").read_text()
    assert "<driver_version>580.159.04</driver_version>" in xml and "<total>143771 MiB</total>" in xml


def test_real_h200_module_is_open_580():
    module = NvidiaKernelModule().process(module_output(REAL / "sys-module-nvidia-version", REAL / "proc-driver-nvidia-version"))
    assert module["loaded"] and module["version"] == "580.159.04" and module["flavour"] == "open"


def test_module_version_from_proc_alone_and_proprietary_flavour():
    proc = ["NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:32:46 UTC 2025"]
    module = NvidiaKernelModule().process([f"{MARK}sys", f"{MARK}proc", *proc])
    assert module["version"] == "580.95.05" and module["flavour"] == "proprietary"
    assert NvidiaKernelModule().process([f"{MARK}sys", f"{MARK}proc"]) == {
        "loaded": False, "version": None, "flavour": None, "nvrm": None}


def test_real_h200_packages_outside_dpkg_and_foreign_holds():
    # captured with '--holds' between dpkg-query and apt-mark showhold; the fact's command prints its marker there
    raw = [f"{MARK}holds" if line == "--holds" else line for line in lines(REAL / "dpkg-query-and-holds.txt")]
    pkgs = NvidiaDriverPackages().process(raw)
    # cuda-compat-13-0 carries a driver-like version (580.95.05-0ubuntu1) but is not the driver
    assert pkgs["installed"] == {}
    assert "libnccl2" in pkgs["held"]
    module = NvidiaKernelModule().process(module_output(REAL / "sys-module-nvidia-version", REAL / "proc-driver-nvidia-version"))
    state = driver_state(pkgs, module)
    assert state["state"] == "module_only" and state["loaded"] == "580.159.04"


def test_held_packages_count_as_installed():
    out = ["hi |nvidia-open|580.95.05-1", "ii |libnvidia-compute|580.95.05-1", "rc |nvidia-open-590|590.44.01-1",
           "ii |nvidia-container-toolkit|1.18.0-1", "ii |linux-image-6.8.0-87-generic|6.8.0-87.88",
           f"{MARK}holds", "nvidia-open"]
    pkgs = NvidiaDriverPackages().process(out)  # kernel packages are KernelPackages' (tests/unit/test_driver_holds.py)
    assert pkgs == {"installed": {"nvidia-open": "580.95.05-1", "libnvidia-compute": "580.95.05-1"},
                    "held": ["nvidia-open"]}
    with pytest.raises(FactProcessError):
        NvidiaDriverPackages().process(["garbage without separators"])


@pytest.mark.parametrize("installed,loaded,state", [
    ("580.95.05-1", "580.95.05", "ok"),
    ("580.95.05-1", "575.57.08", "reboot_required"),
    ("580.95.05-1", None, "reboot_required"),
    (None, None, "not_installed"),
])
def test_driver_state(installed, loaded, state):
    pkgs = {"installed": {"libnvidia-compute": installed}} if installed else {"installed": {}}
    assert driver_state(pkgs, {"version": loaded})["state"] == state


def test_gb10_unified_memory_falls_back_to_host_memory():
    smi = NvidiaSmiGpus().process(smi_output(FIX / "gb10-shaped" / "nvidia-smi-query.csv"))
    (gpu,) = smi["gpus"]
    assert gpu["memory_mib"] is None and gpu["compute_cap"] == "12.1"
    assert gpu_column(smi, 128 * 2**30) == "1x NVIDIA GB10 unified 128.0 GiB cc12.1"


def test_nvidia_smi_mismatch_is_reported_not_raised():
    out = ["Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 580.95", f"{MARK}rc=18"]
    smi = NvidiaSmiGpus().process(out)
    assert smi["gpus"] == [] and "version mismatch" in smi["error"]
    assert gpu_column(smi, 0).startswith("(Failed to initialize NVML")


def test_preflight_refuses_a_gpu_index_nvidia_smi_does_not_list():
    cfg = NodeConfig.model_validate({
        "cluster_name": "x", "node_arch": "x86_64", "gpu_indices": [0, 1], "tensor_parallel_size": 2,
        "model_repo": "a/b", "model_revision": "0" * 40, "model_root": "/m", "image": "registry.example/i", "allow_unpinned_image": True,
    })
    res = {"arch": "x86_64", "disk_free_bytes": 10**12, "model_present_bytes": 0, "disk_path": "/"}
    smi = NvidiaSmiGpus().process(smi_output(REAL / "nvidia-smi-query.csv"))
    (problem,) = problems_for(cfg, res, 2**40, smi)
    assert "GPU index 1 not present (gpu_indices [0, 1]; nvidia-smi lists [0])" in problem


def test_driver_column_flags_reboot_required():
    state = driver_state({"installed": {"libnvidia-compute": "580.95.05-1"}}, {"version": None})
    assert "REBOOT REQUIRED" in driver_column(state)


def test_upstream_version_and_keyring_parser():
    assert upstream_version("580.95.05-0ubuntu0.24.04.2") == "580.95.05"
    assert upstream_version("1:590.44.01-1") == "590.44.01"
    assert upstream_version("1.18.0-1") is None
    fpr = "EB693B3035CD5710E231E123A4B469963BF863CC"  # NVIDIA's CUDA repo key (3bf863cc.pub)
    colons = ["pub:-:4096:1:A4B469963BF863CC:1650000000:::-:::scSC::::::23::0:", f"fpr:::::::::{fpr}:",
              "uid:-::::1650000000::0::cudatools <cudatools@nvidia.com>::::::::::0:", ""]
    assert KeyringFingerprints().process(colons) == [fpr]


def test_a_hung_nvidia_smi_is_stopped_and_refused_by_preflight(tmp_path):
    """A wedged GPU makes nvidia-smi hang for minutes: the fact's own command stops it (here a stand-in that
    sleeps, with the bound shortened) and preflight refuses the host, saying so."""
    import os
    import subprocess

    import facts.nvidia as nv

    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nsleep 60\n")
    (tmp_path / "nvidia-smi").chmod(0o755)
    command = NvidiaSmiGpus().command().replace(f"timeout -k 5 {nv.SMI_TIMEOUT_S} ", "timeout -k 1 1 ")
    assert command != NvidiaSmiGpus().command()
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    smi = NvidiaSmiGpus().process(proc.stdout.splitlines())
    assert smi["gpus"] == [] and smi["hung"] and "did not answer within 30 s" in smi["error"]
    cfg = NodeConfig.model_validate({
        "cluster_name": "x", "node_arch": "x86_64", "gpu_indices": [0], "tensor_parallel_size": 1,
        "model_repo": "a/b", "model_revision": "0" * 40, "model_root": "/m", "image": "registry.example/i",
        "allow_unpinned_image": True,
    })
    res = {"arch": "x86_64", "disk_free_bytes": 10**12, "model_present_bytes": 0, "disk_path": "/"}
    assert problems_for(cfg, res, 2**40, smi) == [smi["error"]]


def test_secure_boot_read_from_the_firmware_variable_and_a_dkms_build_refused(tmp_path):
    """The fact's own command against a real efivars-like directory (4 attribute bytes, then the value) and a
    stand-in mokutil; preflight refuses a DKMS build under Secure Boot until the key is enrolled, and an
    NVSwitch host."""
    import os
    import subprocess

    from deploys.preflight import driver_problems
    from deploys.schema import NvidiaDriverKeys
    from facts.nvidia import SecureBoot

    efivars, mok, bin_dir = tmp_path / "efivars", tmp_path / "MOK.der", tmp_path / "bin"
    efivars.mkdir()
    bin_dir.mkdir()

    def read(enrolled: bool = False) -> dict:
        (bin_dir / "mokutil").write_text("#!/bin/sh\necho '%s'\n" % ("MOK.der is already enrolled" if enrolled
                                                                       else "MOK.der is not enrolled"))
        (bin_dir / "mokutil").chmod(0o755)
        command = SecureBoot().command(efivars=str(efivars), mok=str(mok))
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                             env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}).stdout
        return SecureBoot().process(out.splitlines())

    assert read() == {"enabled": None, "mok_enrolled": None}  # no EFI variables, no key
    var = efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    var.write_bytes(b"\x06\x00\x00\x00\x00")
    assert read()["enabled"] is False
    var.write_bytes(b"\x06\x00\x00\x00\x01")
    mok.write_bytes(b"key")
    sb = read()
    assert sb == {"enabled": True, "mok_enrolled": False}
    fresh = {"state": "not_installed", "reason": "no driver package installed and no module loaded"}
    (problem,) = driver_problems(NvidiaDriverKeys(), fresh, sb)
    assert problem.startswith("Secure Boot is on and the driver is about to be built by DKMS")
    assert driver_problems(NvidiaDriverKeys(), fresh, read(enrolled=True)) == []
    assert driver_problems(NvidiaDriverKeys(), {"state": "ok", "reason": ""}, sb) == []  # it loads already
    assert driver_problems(NvidiaDriverKeys(nvidia_driver_source="preinstalled"), fresh, sb) == []
    (switch,) = driver_problems(NvidiaDriverKeys(), {"state": "ok", "reason": ""}, {}, nvswitch=True)
    assert "nvidia-fabricmanager" in switch
