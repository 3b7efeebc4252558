"""Container runtime on sandbox nodes: a GPU index missing from the CDI spec is refused, credentials never
reach any output, and a toolkit that writes additionalGids (1.19) is tamed by the feature flag.

Runs after test_10/test_20 (module order) on the same session nodes.
"""

from __future__ import annotations

import base64
import json
import os

from tests.node.conftest import INVENTORY, changed_operations, on_node, pyinfra

SPEC = "/var/run/cdi/nvidia.yaml"


def test_a_missing_gpu_is_refused_naming_host_and_index(sandbox):
    node = sandbox[0]  # gpu_indices [0, 1]; the stand-in hardware loses GPU 1
    assert on_node(node, "echo 1 > /etc/stand-in-gpus && systemctl restart nvidia-cdi-refresh.service").returncode == 0
    # the full entry point: preflight names it, before anything changes
    proc = pyinfra(INVENTORY, "deploys/all.py", "--limit", node, check=False)
    assert proc.returncode == 1
    assert f"host {node}: GPU index 1 not present (gpu_indices [0, 1]; nvidia-smi lists [0])" in proc.stderr
    # the runtime component alone checks the CDI spec itself, after regenerating it once
    proc = pyinfra(INVENTORY, "deploys.container_runtime.container_runtime", "--limit", node, check=False)
    assert proc.returncode == 1
    assert f"[{node}]" in proc.stderr and "GPU index 1 is not a device of the spec" in proc.stderr
    # the GPU is back: the next converge regenerates the spec and passes
    assert on_node(node, "echo 2 > /etc/stand-in-gpus").returncode == 0
    changed = changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node))
    assert changed == [("Container runtime | Check the CDI spec lists every GPU the service uses", [node])]


def test_registry_credentials_are_0600_and_never_printed(sandbox):
    node = sandbox[0]
    auth_file = os.path.join(os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox"), "registry/auth.json")
    blob = json.load(open(auth_file))["auths"]["registry.home.arpa"]["auth"]
    secret = base64.b64decode(blob).decode().split(":", 1)[1]
    assert on_node(node, "rm -f /etc/inference-nodes/secrets/registry-auth.json").returncode == 0
    proc = pyinfra("-vvv", "--diff", INVENTORY, "deploys/all.py", "--limit", node)
    assert "Install registry credentials" in proc.stderr
    for text in (proc.stdout, proc.stderr):
        assert secret not in text and blob not in text
    assert on_node(node, "stat -c '%a %U' /etc/inference-nodes/secrets/registry-auth.json").stdout.strip() == "600 root"


def test_toolkit_1_19_spec_without_additional_gids_unless_asked(sandbox):
    node = sandbox[1]
    v119 = '"1.19.1-1"'
    changed = changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", node,
                                         "--data", f"nvidia_toolkit_version={v119}"))
    assert ("Container runtime | Install the NVIDIA container toolkit 1.19.1-1", [node]) in changed
    spec = on_node(node, f"cat {SPEC}").stdout
    assert "additionalGids" not in spec and "cdiVersion: 0.5.0" in spec

    pyinfra(INVENTORY, "deploys/all.py", "--limit", node, "--data", f"nvidia_toolkit_version={v119}",
            "--data", "cdi_no_additional_gids=false")
    spec = on_node(node, f"cat {SPEC}").stdout
    assert "additionalGids" in spec and "cdiVersion: 0.7.0" in spec  # Podman 4.9.3 would reject this one

    pyinfra(INVENTORY, "deploys/all.py", "--limit", node)  # back to the inventory's 1.18.2-1
    assert on_node(node, "dpkg-query -W -f='${Version}' nvidia-ctk nvidia-container-toolkit 2>/dev/null").stdout.endswith("1.18.2-1")
    assert "additionalGids" not in on_node(node, f"cat {SPEC}").stdout
    assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py")) == []


def test_an_image_pinned_by_its_index_digest_is_present_without_a_pull(sandbox):
    """The sandbox registry serves the vLLM image under an index (multi-arch shaped), and the inventory pins the
    index digest, as a lab pins what a registry's tag points at. Podman's `.Digest` is the platform manifest's
    (containers/podman#24858); the deploy finds the image by its repo digests, so the converges before this test
    pulled nothing and changed nothing (test_10's second run), and the audit finds it by the pinned digest."""
    from deploys.inventory import inventory_configs, load_inventory

    configs = inventory_configs(load_inventory(INVENTORY))
    store = os.path.join(os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox"), "registry", "digest")
    for node in sandbox:
        cfg = configs[node]
        assert cfg.image_digest == open(store).read().strip()
        # by its tag (podman answers a lookup by digest with that digest; by tag, with the platform manifest's)
        own = on_node(node, f"podman image inspect --format '{{{{.Digest}}}}' {cfg.image}")
        assert own.returncode == 0 and own.stdout.strip().startswith("sha256:"), own.stderr
        assert own.stdout.strip() != cfg.image_digest, "the sandbox image is not under an index: the test shows nothing"
        repo = on_node(node, f"podman image inspect --format '{{{{range .RepoDigests}}}}{{{{.}}}} {{{{end}}}}' {cfg.image_ref}")
        assert f"@{cfg.image_digest}" in repo.stdout, repo.stdout
    proc = pyinfra("--json", INVENTORY, "deploys.container_runtime.container_runtime", "--limit", sandbox[0])
    assert changed_operations(proc) == [], proc.stderr[-2000:]
