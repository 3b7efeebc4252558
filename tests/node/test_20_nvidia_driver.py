"""The driver on sandbox nodes: the pin really holds 580 against 590, a 590 node is refused, and
allow_driver_change moves it to 580 (reboot included) and leaves it converged; on the DGX OS nodes (GB10
profiles, the driver preinstalled by tests/sandbox/node.sh) the running kernel, its NVIDIA modules package and
the userspace driver are held, and userspace upgraded without its modules package is refused. A follow-up
step that failed once (systemd's re-exec) is completed by the next run.

The first two tests run after test_10_converge.py (pytest orders modules by name) on the same session nodes;
the others converge what they need themselves (`-k` selects them alone).
"""

from __future__ import annotations

import subprocess
import sys

from tests.node.conftest import INVENTORY, changed_operations, on_node, pyinfra, wait_serving

NO_PIN = "-o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null"


def _sim(node: str, options: str) -> str:
    proc = on_node(node, f"apt-get -s {options} dist-upgrade")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_pin_and_hold_keep_590_out_and_the_test_can_fail(sandbox):
    node = sandbox[0]
    assert "Inst " not in _sim(node, "")                           # pin + hold
    assert "Inst nvidia-open" not in _sim(node, "--ignore-hold")   # the pin alone
    # Without pin and hold apt would take the newer branch: the checks above are not vacuous.
    assert "Inst nvidia-open [580.95.05-1] (590.44.01-1" in _sim(node, f"--ignore-hold {NO_PIN}")


def _install_590_and_reboot(node: str):
    script = (
        "set -e; apt-mark unhold $(apt-mark showhold) >/dev/null; "
        "mv /etc/apt/preferences.d/90-inference-nodes-nvidia-driver /root/pin.bak; "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q nvidia-open=590.44.01-1 libnvidia-compute=590.44.01-1 "
        "nvidia-kernel-open=590.44.01-1 nvidia-utils=590.44.01-1 nvidia-driver-pinning-590 >/dev/null; "
        "DEBIAN_FRONTEND=noninteractive apt-get remove -y -q nvidia-driver-pinning-580 >/dev/null; "
        "apt-mark hold nvidia-open >/dev/null; mv /root/pin.bak /etc/apt/preferences.d/90-inference-nodes-nvidia-driver"
    )
    proc = on_node(node, script)
    assert proc.returncode == 0, proc.stderr
    pyinfra(INVENTORY, "server.reboot", "delay=5", "interval=1", "reboot_timeout=120", "--limit", node)
    assert set(on_node(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()) == {"590.44.01"}


def test_node_on_590_is_refused_then_moved_with_allow_driver_change(sandbox):
    node = "sandbox-a"  # deployment A installs from the (stand-in) CUDA repo; GB10's driver is preinstalled
    _install_590_and_reboot(node)

    refused = pyinfra(INVENTORY, "deploys/all.py", "--limit", node, check=False)
    assert refused.returncode == 1
    assert f"{node} runs another driver branch (libnvidia-compute 590.44.01-1" in refused.stderr
    assert "Set allow_driver_change: true" in refused.stderr
    assert on_node(node, "dpkg-query -W -f='${Version}' nvidia-open").stdout == "590.44.01-1"

    moved = pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node, "--data", "allow_driver_change=true")
    changed = [name for name, _ in changed_operations(moved)]
    assert "NVIDIA driver | Install driver branch 580: nvidia-driver-pinning-580, nvidia-open" in changed
    assert "NVIDIA driver | Check the loaded kernel module is the installed driver" in changed  # rebooted
    assert set(on_node(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split()) == {"580.95.05"}
    assert on_node(node, "dpkg -l | grep -c 'ii  nvidia-driver-pinning-590'").stdout.strip() == "0"

    wait_serving([node])  # a one-node cluster: its service came back with the reboots
    again = pyinfra("--json", INVENTORY, "deploys/all.py")
    assert changed_operations(again) == []


DGX = "sandbox-b0"
SOURCE_FILE = "/etc/apt/sources.list.d/inference-nodes-nvidia-cuda.sources"
KEYRING = "/etc/apt/keyrings/inference-nodes-nvidia-cuda.gpg"
DRIVER = "deploys.nvidia_driver.nvidia_driver"


def _ok(node: str, command: str) -> str:
    proc = on_node(node, command)
    assert proc.returncode == 0, f"{command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def _moves(sim: str) -> list[str]:
    """Driver and kernel packages an upgrade would install or remove (the distribution's own updates aside)."""
    return [line for line in sim.splitlines() if line.startswith(("Inst ", "Remv "))
            and line.split()[1].startswith(("nvidia-", "libnvidia-", "linux-image-", "linux-modules-"))]


def test_preinstalled_driver_is_held_with_the_running_kernel_and_its_modules_package(sandbox):
    kernel = _ok(DGX, "uname -r").strip()
    # left over from a node that once installed from NVIDIA's CUDA repo: a preinstalled driver removes them
    leftovers = f"{SOURCE_FILE} {KEYRING}"
    _ok(DGX, f"mkdir -p /etc/apt/keyrings && touch {leftovers}")
    pyinfra(INVENTORY, DRIVER, "--limit", DGX)
    assert _ok(DGX, f"ls {leftovers} 2>/dev/null || true").strip() == ""
    held = set(_ok(DGX, "apt-mark showhold").split())
    assert {"nvidia-driver-580-open", "libnvidia-compute-580", "nvidia-utils-580", "nvidia-kernel-common-580",
            f"linux-image-{kernel}", f"linux-modules-nvidia-580-open-{kernel}", "linux-image-nvidia-hwe-24.04",
            "linux-modules-nvidia-580-open-nvidia-hwe-24.04"} <= held, held
    _ok(DGX, "apt-get update -qq")  # the node's own (DGX OS stand-in) repo offers 580.126.09 and a next kernel
    assert _moves(_sim(DGX, "")) == []
    free = _moves(_sim(DGX, "--ignore-hold"))  # without the holds both would move: the check above is not vacuous
    assert any(line.startswith("Inst linux-image-9.9.9-9999-standin ") for line in free), free
    assert any(line.startswith("Inst libnvidia-compute-580 [580.95.05-0ubuntu1] (580.126.09-0ubuntu1") for line in free), free
    assert changed_operations(pyinfra("--json", INVENTORY, DRIVER, "--limit", DGX)) == []
    audit = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/audit/test_nvidia_driver.py", "--inventory",
                            INVENTORY, "--limit", DGX, "-rA", "-k", "held or alone or unattended or loaded"],
                           capture_output=True, text=True, timeout=300)
    assert audit.returncode == 0, audit.stdout[-3000:]
    assert f"PASSED tests/audit/test_nvidia_driver.py::test_kernel_held_with_its_nvidia_modules[{DGX}]" in audit.stdout


def test_userspace_upgraded_without_its_modules_package_is_refused_naming_the_versions(sandbox):
    kernel = _ok(DGX, "uname -r").strip()
    _ok(DGX, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-change-held-packages "
             "libnvidia-compute-580=580.126.09-0ubuntu1 >/dev/null")
    try:
        why = (f"DRIVER PACKAGES DIFFER (linux-modules-nvidia-580-open-{kernel} carries module 580.95.05, userspace "
               "driver 580.126.09 is installed, module 580.95.05 is loaded)")
        pre = pyinfra(INVENTORY, "deploys.preflight.preflight", "--limit", DGX, check=False)
        assert pre.returncode == 1
        assert f"host {DGX}: {why}" in pre.stderr and "nothing was changed on its members" in pre.stderr
        driver = pyinfra(INVENTORY, DRIVER, "--limit", DGX, check=False)
        assert driver.returncode == 1 and f"{DGX}: {why}" in driver.stderr
    finally:
        _ok(DGX, "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --allow-downgrades --allow-change-held-packages "
                 "libnvidia-compute-580=580.95.05-0ubuntu1 >/dev/null")
    pyinfra(INVENTORY, DRIVER, "--limit", DGX)


DEFAULTS_FILE = "/etc/systemd/system.conf.d/90-inference-nodes.conf"
TUNING = "deploys.host_tuning.host_tuning"
REEXEC = "Host tuning | Re-execute systemd so the new default limits apply"
FAILING_REEXEC = ('#!/bin/sh\n[ "$1" = daemon-reexec ] && { echo "daemon-reexec refused (test)" >&2; exit 1; }\n'
                  'exec /usr/bin/systemctl "$@"\n')


def test_a_follow_up_that_failed_after_the_write_is_completed_by_the_next_run(sandbox):
    """The real Ubuntu host's case: the defaults file was written, `systemctl daemon-reexec` failed, and every
    later run said "No change". Decided from systemd's manager state, the next run re-executes systemd."""
    node = "sandbox-b1"
    nofile = "systemctl show -p DefaultLimitNOFILE --value"
    pyinfra(INVENTORY, TUNING, "--limit", node)
    want = _ok(node, nofile).strip()
    # an older defaults file, applied; then a daemon-reexec that fails (first in root's PATH on the node)
    _ok(node, f"sed -i 's/^DefaultLimitNOFILE=.*/DefaultLimitNOFILE=4096/' {DEFAULTS_FILE} && systemctl daemon-reexec")
    assert _ok(node, nofile).strip() == "4096" != want
    _ok(node, f"printf '{FAILING_REEXEC}' > /usr/local/sbin/systemctl && chmod 755 /usr/local/sbin/systemctl")
    try:
        assert _ok(node, "command -v systemctl").strip() == "/usr/local/sbin/systemctl"
        failed = pyinfra(INVENTORY, TUNING, "--limit", node, check=False)
    finally:
        _ok(node, "rm -f /usr/local/sbin/systemctl")
    assert failed.returncode != 0 and "daemon-reexec refused (test)" in failed.stderr
    assert f"DefaultLimitNOFILE={want}" in _ok(node, f"cat {DEFAULTS_FILE}")  # written ...
    assert _ok(node, nofile).strip() == "4096"                                  # ... not applied
    changed = changed_operations(pyinfra("--json", INVENTORY, TUNING, "--limit", node))
    assert changed == [(REEXEC, [node])], changed
    assert _ok(node, nofile).strip() == want
    assert changed_operations(pyinfra("--json", INVENTORY, TUNING, "--limit", node)) == []
