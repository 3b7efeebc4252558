"""The driver on sandbox nodes: the pin really holds 580 against 590, a 590 node is refused, and
allow_driver_change moves it to 580 (reboot included) and leaves it converged.

Runs after test_10_converge.py (pytest orders modules by name) on the same session nodes.
"""

from __future__ import annotations

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
    assert on_node(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split() == ["590.44.01"]


def test_node_on_590_is_refused_then_moved_with_allow_driver_change(sandbox):
    node = sandbox[-1]
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
    assert on_node(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").stdout.split() == ["580.95.05"]
    assert on_node(node, "dpkg -l | grep -c 'ii  nvidia-driver-pinning-590'").stdout.strip() == "0"

    # sandbox-b1 rebooted alone (twice): its worker cannot join the head's running job. The job probes
    # restart both in time; here the pair is re-formed at once, as an admin would (worker, then head).
    for n in ("sandbox-b1", "sandbox-b0"):
        assert on_node(n, "systemctl restart inference.service").returncode == 0
    wait_serving(sandbox)
    again = pyinfra("--json", INVENTORY, "deploys/all.py")
    assert changed_operations(again) == []
