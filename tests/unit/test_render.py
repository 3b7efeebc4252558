"""`python -m deploys.render`: every file the deploy installs, per host, without connecting or secrets."""

import os
import shlex
import subprocess
import sys

from deploys.service.unit import unit_sections
from tests.unit.profiles import lab_filled_in


def test_whole_lab_inventory_renders(tmp_path):
    refused = subprocess.run([sys.executable, "-m", "deploys.render", "inventories/lab.py", str(tmp_path / "out")],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "spark-c0.lab.example: key 'model_revision'" in refused.stderr
    assert not os.path.exists(tmp_path / "out")
    lab = lab_filled_in(tmp_path / "filled")  # C with its profile gaps set
    tmp_path = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "deploys.render", lab, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    hosts = sorted(os.listdir(tmp_path))
    assert hosts == ["gb10-b0.lab.example", "gb10-b1.lab.example", "rtx-pro-a.lab.example",
                     "spark-c0.lab.example", "spark-c1.lab.example"]
    for host in hosts:
        for rel in ("etc/apt/preferences.d/90-inference-nodes-nvidia-driver",
                    "etc/security/limits.d/90-inference-nodes.conf", "etc/inference-nodes/fabric.env",
                    "usr/local/bin/inference-nodes-model-gate",
                    "etc/containers/registries.conf.d/90-inference-nodes.conf"):
            assert os.path.isfile(tmp_path / host / rel), (host, rel)
    unit = (tmp_path / "gb10-b1.lab.example/etc/containers/systemd/inference.container").read_text()
    argv = shlex.split(dict(dict(unit_sections(unit))["Container"])["Exec"])
    for flag in ("--tensor-parallel-size", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"):
        assert flag in argv, flag
    # GB10 runs DGX OS's preinstalled driver: no CUDA repo there (the arm64 `sbsa` path of a profile that does
    # install from it: tests/unit/test_nvidia_driver_render.py)
    source = "etc/apt/sources.list.d/inference-nodes-nvidia-cuda.sources"
    assert not os.path.exists(tmp_path / "gb10-b0.lab.example" / source)
    assert "/ubuntu2404/x86_64/" in (tmp_path / "rtx-pro-a.lab.example" / source).read_text()


def test_limit_renders_one_host_and_refuses_an_unknown_one(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "deploys.render", "inventories/lab.py", str(tmp_path),
                           "--limit", "gb10-b0.lab.example"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and os.listdir(tmp_path) == ["gb10-b0.lab.example"], proc.stderr  # C's gaps left out
    refused = subprocess.run([sys.executable, "-m", "deploys.render", "inventories/lab.py", str(tmp_path),
                              "--limit", "gb10-mtp"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "spark-c1.lab.example: key 'image'" in refused.stderr
    bad = subprocess.run([sys.executable, "-m", "deploys.render", "inventories/lab.py", str(tmp_path),
                          "--limit", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "nope" in bad.stderr
