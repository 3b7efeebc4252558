"""Audit of the inference service: the unit the inventory renders is installed, generated and running,
gated on the verified model, with its persistent JIT directories, and the API listens where the
inventory says and nowhere else."""

import ipaddress
import json

import pytest

from deploys.service import backoff
from deploys.service.release import gate_record_path, release_named, release_of

from deploys.service.unit import UNIT_DIR, container_argv, fingerprint, render_cluster, render_service_env, service_env_path, service_environment, started_from_path
from deploys.model.snapshot import STAMP
from deploys.schema import cluster_head, clusters
from tests.audit.conftest import audited_inventory


def _configs(pytestconfig):
    return audited_inventory(pytestconfig.getoption("inventory"), tuple(pytestconfig.getoption("limit")))[0]


def _expected_unit(node, pytestconfig) -> str:
    return render_cluster(_configs(pytestconfig))[node.name]


def _cluster(node, pytestconfig):
    members = clusters(_configs(pytestconfig))[node.cfg.cluster_name]
    return cluster_head(members), len(members)


def test_unit_installed_as_rendered(node, pytestconfig):
    f = node.host.file(f"{UNIT_DIR}/{node.cfg.container_name}.container")
    assert f.is_file and f.user == "root" and f.mode == 0o644
    assert f.content_string == _expected_unit(node, pytestconfig)


def test_restart_backoff_reset_timer_is_installed_and_active(node):
    """The unit heals for its whole life: the timer that sets the growing restart delay back runs (issue 51)."""
    for suffix, render in ((".service", backoff.render_service), (".timer", backoff.render_timer)):
        unit = node.host.file(f"{backoff.UNIT_DIR}/{backoff.UNIT}{suffix}")
        assert unit.exists and unit.content_string == render(node.cfg), f"{backoff.UNIT}{suffix} is not the rendered one"
    timer = node.host.service(f"{backoff.UNIT}.timer")
    assert timer.is_enabled and timer.is_running, f"{backoff.UNIT}.timer is not enabled and active"


def test_service_environment_only_in_a_root_only_file(node, pytestconfig):
    """service_env values may be secrets: they live in a 0600 env file, never in the world-readable unit or in
    what `systemctl show` prints to every user."""
    head, nodes = _cluster(node, pytestconfig)
    f = node.host.file(service_env_path(node.cfg))
    assert f.is_file and (f.user, f.group, f.mode) == ("root", "root", 0o600)
    assert f.content_string == render_service_env(node.cfg, head, nodes)
    shown = node.host.check_output(f"systemctl show -p Environment {node.cfg.container_name}.service")
    unit = node.host.file(f"{UNIT_DIR}/{node.cfg.container_name}.container").content_string
    for key, value in node.cfg.service_env.items():
        assert f"{key}={value}" not in shown and f"{key}={value}" not in unit, key


def test_serves_the_release_the_inventory_asks_for(node, head_only, pytestconfig):
    """The release the head last passed the serving gate with (recorded by the converge) is the one the inventory
    asks for: the image, the model commit and manifest, the unit and its environment."""
    head, nodes = _cluster(node, pytestconfig)
    wanted = release_of(node.cfg, fingerprint(_expected_unit(node, pytestconfig), node.cfg, head, nodes))
    record = node.host.file(gate_record_path(node.cfg))
    assert record.is_file, (f"{node.name}: no serving gate has passed since a converge last (re)started "
                            f"{node.cfg.container_name}.service ({record.path} is missing)")
    served = json.loads(record.content_string)
    assert served.get("release") == wanted["release"], (
        f"{node.name}: serves {release_named(served)} (passed the serving gate {served.get('passed_at')}); "
        f"the inventory asks for {release_named(wanted)}")


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


def test_api_listens_where_the_inventory_says_and_nowhere_else(node, pytestconfig):
    """vLLM itself on engine_port, on loopback (the head's door, on the clients' api_port, is the endpoint audit's)."""
    port = node.cfg.engine_port
    listening = node.host.check_output(f"ss -Hltn 'sport = :{port}'").split()
    local = [w for w in listening if w.endswith(f":{port}")]
    _, nodes = _cluster(node, pytestconfig)
    if nodes > 1 and node.cfg.node_rank > 0:
        assert local == [], f"a worker (--headless) serves no API, but {local} listen"
    else:
        address = node.cfg.engine_address
        assert local == [f"[{address}]:{port}" if ":" in address else f"{address}:{port}"], local


def test_running_container_is_the_rendered_one(node, pytestconfig):
    """What runs, not only what is on disk: a unit edited by hand and applied differs here until a converge."""
    head, nodes = _cluster(node, pytestconfig)
    unit = _expected_unit(node, pytestconfig)
    started = node.host.run(f"cat {started_from_path(node.cfg)}").stdout.split()
    assert started[:1] == [fingerprint(unit, node.cfg, head, nodes)], \
        "the service was started from another unit or env file"
    stamp_now = node.host.run(f"sha256sum < {STAMP}").stdout.split()[:1]
    assert started[1:2] == stamp_now, "the service was started from another verified snapshot (repaired since)"
    inspect = node.host.run(f"podman container inspect --format json {node.cfg.container_name}")
    assert inspect.rc == 0, inspect.stderr
    config = json.loads(inspect.stdout)[0]["Config"]
    assert (config.get("Cmd") or []) == container_argv(node.cfg, head, nodes)
    env = dict(item.split("=", 1) for item in config.get("Env") or [])
    expected = service_environment(node.cfg, head, nodes)
    assert {k: env.get(k) for k in expected} == expected


def test_limits_in_effect_for_the_service(node):
    pid = node.host.check_output(f"systemctl show -p MainPID --value {node.cfg.container_name}.service")
    limits = node.host.check_output(f"cat /proc/{pid}/limits")
    rows = {line[:26].strip(): line[26:].split() for line in limits.splitlines()[1:]}
    memlock = "unlimited" if node.cfg.limits_memlock == "unlimited" else str(node.cfg.limits_memlock)
    assert rows["Max open files"][:2] == [str(node.cfg.limits_nofile)] * 2
    assert rows["Max locked memory"][:2] == [memlock] * 2
    assert rows["Max stack size"][1] in (str(node.cfg.limits_stack), "unlimited")


def test_fabric_nodes_use_a_valid_roce_v2_gid(node):
    if node.cfg.fabric_address is None:
        pytest.skip("single-node profile: no fabric")
    env = dict(line.split("=", 1) for line in
               node.host.file("/run/inference-nodes/roce.env").content_string.split())
    device, port = env["NCCL_IB_HCA"].split(":")
    index = env["NCCL_IB_GID_INDEX"]
    base = f"{node.cfg.roce_sysfs_root}/class/infiniband/{device}/ports/{port}"
    assert node.host.file(f"{base}/gid_attrs/types/{index}").content_string.strip() == "RoCE v2"
    gid = node.host.file(f"{base}/gids/{index}").content_string.strip()
    assert ipaddress.IPv6Address(gid).ipv4_mapped == ipaddress.ip_address(node.cfg.fabric_address)


CONTAINER_VIEW = ("import glob, json, os, re, resource; s = os.statvfs('/dev/shm'); "
                  "print(json.dumps({'memlock': resource.getrlimit(resource.RLIMIT_MEMLOCK), "
                  "'shm': s.f_blocks * s.f_frsize, 'devices': {d: os.path.exists(d) for d in os.sys.argv[1:]}, "
                  "'gpus': sorted(int(p[11:]) for p in glob.glob('/dev/nvidia[0-9]*') if re.fullmatch(r'/dev/nvidia[0-9]+', p)), "
                  "'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), 'order': os.environ.get('CUDA_DEVICE_ORDER')}))")


def test_container_has_the_devices_memlock_and_shm_it_needs(node):
    """Inside the running container, as the serving process sees it: the RDMA devices the profile passes, the GPUs
    and CUDA's numbering of them, the locked-memory limit, and a /dev/shm of the size that was checked (the host's with --ipc=host,
    ShmSize= otherwise; never Podman's 64 MiB default by accident)."""
    name = node.cfg.container_name
    view = node.host.run(f"podman exec {name} {node.cfg.vllm_python} -c \"{CONTAINER_VIEW}\" "
                         + " ".join(node.cfg.container_devices))
    assert view.rc == 0, view.stderr
    seen = json.loads(view.stdout)
    assert seen["devices"] == {d: True for d in node.cfg.container_devices}
    memlock = -1 if node.cfg.limits_memlock == "unlimited" else node.cfg.limits_memlock
    infinity = 2**64 - 1  # RLIM_INFINITY as Python reports it on Linux
    assert [v if v != infinity else -1 for v in seen["memlock"]] == [memlock, memlock]
    ipc = node.host.check_output(f"podman container inspect --format '{{{{.HostConfig.IpcMode}}}}' {name}")
    if node.cfg.container_ipc_host:
        assert ipc == "host"
        host_shm = int(node.host.check_output("df -P -B1 /dev/shm | awk 'NR==2 {print $2}'"))
        assert seen["shm"] == host_shm
    else:
        assert ipc != "host"
        assert seen["shm"] == node.cfg.container_shm_bytes
    assert seen["shm"] >= node.cfg.shm_required_bytes
    # the GPUs: CDI passes only the inventory's devices and CUDA numbers them from 0 (host indices there match no
    # device: vLLM crash-loops); a privileged container sees every GPU, and then the host's indices in PCI order
    cuda = [int(i) for i in (seen["cuda"] or "").split(",") if i.strip()]
    if node.cfg.container_privileged:
        assert set(node.cfg.gpu_indices) <= set(seen["gpus"]), seen
        assert cuda == node.cfg.gpu_indices and seen["order"] == "PCI_BUS_ID", seen
    else:
        assert seen["gpus"] == sorted(node.cfg.gpu_indices), f"the container sees GPUs {seen['gpus']}"
        assert cuda == list(range(len(seen["gpus"]))), f"CUDA_VISIBLE_DEVICES={seen['cuda']} inside, {len(seen['gpus'])} GPUs"


def test_nccl_the_service_loads_is_not_known_bad(node, pytestconfig):
    """The NCCL runtime inside the pinned image, as the serving process loads it (not torch's compile-time
    version), against files/inference_service/nccl-known-bad.json: multi-node aarch64 profiles fail on
    2.28.9 / 2.29.2 (silent deadlock; fixed in 2.29.3)."""
    import shlex

    from files.inference_service import nccl_runtime

    _, nodes = _cluster(node, pytestconfig)
    if nodes < 2:
        pytest.skip("single-node profile: NCCL does not cross the fabric")
    with open(nccl_runtime.__file__) as f:
        code = f.read()
    run = node.host.run(f"podman exec {node.cfg.container_name} {node.cfg.vllm_python} -c {shlex.quote(code)}")
    seen = json.loads(run.stdout.strip().splitlines()[-1]) if run.stdout.strip() else {"error": run.stderr[-300:]}
    if seen.get("cuda", "") is None:
        pytest.skip("the image's torch has neither CUDA nor ROCm and no VLLM_NCCL_SO_PATH is set: it loads no NCCL")
    assert "error" not in seen, f"cannot read the NCCL runtime in the image: {seen['error']}"
    bad = nccl_runtime.known_bad(seen["version"], node.cfg.node_arch, multi_node=True)
    assert bad is None, (f"NCCL {seen['version']} ({seen['library']}) {bad['problem']}; fixed in {bad['fixed_in']} "
                         f"({bad['source']})")
