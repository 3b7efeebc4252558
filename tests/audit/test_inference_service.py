"""Audit of the inference service: the unit the inventory renders is installed, generated and running,
gated on the verified model, with its persistent JIT directories, and the API listens where the
inventory says and nowhere else."""

from deploys.inference_service import UNIT_DIR, render_cluster
from deploys.inventory import inventory_configs

from tests.audit.conftest import INVENTORY, load_inventory


def _expected_unit(node) -> str:
    return render_cluster(inventory_configs(load_inventory(INVENTORY)))[node.name]


def test_unit_installed_as_rendered(node):
    f = node.host.file(f"{UNIT_DIR}/{node.cfg.container_name}.container")
    assert f.is_file and f.user == "root" and f.mode == 0o644
    assert f.content_string == _expected_unit(node)


def test_generated_service_running_behind_the_gate(node):
    service = f"{node.cfg.container_name}.service"
    shown = node.host.check_output(f"systemctl show -p ActiveState -p SourcePath -p UnitFileState {service}")
    props = dict(line.split("=", 1) for line in shown.splitlines())
    assert props["ActiveState"] == "active"
    assert props["SourcePath"] == f"{UNIT_DIR}/{node.cfg.container_name}.container"
    assert props["UnitFileState"] == "generated"
    assert node.host.run("inference-nodes-model-gate").rc == 0


def test_jit_directories_persist(node):
    for path in (node.cfg.jit_cache_dir, node.cfg.container_tmp_dir):
        if path:
            d = node.host.file(path)
            assert d.is_directory and d.user == "root"


def test_api_listens_where_the_inventory_says_and_nowhere_else(node):
    port = node.cfg.api_port
    listening = node.host.check_output(f"ss -Hltn 'sport = :{port}'").split()
    local = [w for w in listening if w.endswith(f":{port}")]
    assert local == [f"{node.cfg.api_bind_address}:{port}"], local
