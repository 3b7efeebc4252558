"""Rendering of the host-tuning files and the /dev/shm rule."""


import pytest

from deploys.host_tuning import render_fabric_env, render_limits, render_systemd_defaults, shm_problem
from deploys.schema import NodeConfig
from tests.unit.profiles import profile

PROFILE_B = profile("gb10_dspark")


def cfg(**changes) -> NodeConfig:
    return NodeConfig.model_validate({**PROFILE_B, "node_rank": 0, "tensor_parallel_size": 1, **changes})


def _entries(text):
    return {tuple(line.split()[:3]): line.split()[3] for line in text.splitlines() if line and not line.startswith("#")}


def test_limits_cover_users_and_root_in_kib():
    entries = _entries(render_limits(cfg()))
    assert len(entries) == 12
    for domain in ("*", "root"):
        for kind in ("soft", "hard"):
            assert entries[(domain, kind, "memlock")] == "unlimited"
            assert entries[(domain, kind, "nofile")] == "1048576"
            assert entries[(domain, kind, "stack")] == "65536"  # 64 MiB in KiB


def test_finite_memlock_is_converted_per_file():
    c = cfg(limits_memlock=2**30)
    assert _entries(render_limits(c))[("*", "hard", "memlock")] == str(2**20)
    assert "DefaultLimitMEMLOCK=1073741824\n" in render_systemd_defaults(c)


@pytest.mark.parametrize("memlock, limits_d, systemd, podman", [
    ("unlimited", "unlimited", "infinity", "-1"),
    (2**30, str(2**20), str(2**30), str(2**30)),
    (65536 + 1023, "64", "66559", "66559"),  # limits.d rounds down to whole KiB
])
def test_memlock_in_each_readers_form(memlock, limits_d, systemd, podman):
    c = cfg(limits_memlock=memlock)
    assert (c.memlock_limits_d, c.memlock_systemd, c.memlock_podman) == (limits_d, systemd, podman)


def test_systemd_defaults_in_bytes():
    text = render_systemd_defaults(cfg())
    assert "[Manager]\nDefaultLimitMEMLOCK=infinity\nDefaultLimitNOFILE=1048576\nDefaultLimitSTACK=67108864\n" in text


def test_fabric_env_is_sorted_key_value_lines():
    lines = [line for line in render_fabric_env(cfg()).splitlines() if not line.startswith("#")]
    assert lines == ["UCX_MEM_MMAP_HOOK_MODE=none", "UCX_RCACHE_MAX_UNRELEASED=1024"]
    single = render_fabric_env(cfg(fabric_env={}))
    assert all(line.startswith("#") for line in single.splitlines())


@pytest.mark.parametrize("have,need,bad", [(9 * 2**30, 9 * 2**30, False), (9 * 2**30 - 1, 9 * 2**30, True)])
def test_shm_problem_boundary(have, need, bad):
    problem = shm_problem(have, need, "kv")
    assert (problem is not None) == bad
    if bad:
        assert "kv needs 9.0 GiB" in problem


def _prepared_on_local(data: dict):
    """host_shm_large_enough prepared by real pyinfra for this machine (@local); add_op runs the operation's
    body, where the OperationError of before was raised, stopping every host of the run."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.operation import add_op

    from deploys.host_tuning import host_shm_large_enough

    state = State(Inventory((["@local"], data)), Config())
    connect_all(state)
    add_op(state, host_shm_large_enough, name="Check /dev/shm holds the KV offload")
    return state, state.inventory.get_host("@local")


def test_a_small_host_shm_fails_that_host_alone(caplog):
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operations import run_ops

    # --ipc=host and a need no machine's /dev/shm meets: preparing raises nothing, running fails the host
    state, local = _prepared_on_local({**profile("rtx_pro_6000_pair"), "node_rank": 0, "shm_headroom_gib": 65536})
    with pytest.raises(PyinfraError, match="No hosts remaining"):  # pyinfra's word when its only host failed
        run_ops(state)
    assert local in state.failed_hosts
    assert "@local: /dev/shm is " in caplog.text and "needs 65544.0 GiB" in caplog.text


def test_a_private_container_shm_is_not_checked_on_the_host():
    from pyinfra.api.operations import run_ops

    state, local = _prepared_on_local({**PROFILE_B, "node_rank": 0, "tensor_parallel_size": 1,
                                       "shm_headroom_gib": 65536, "container_shm_size": "70000g"})
    run_ops(state)
    assert local not in state.failed_hosts


def test_manager_limits_fact_reads_what_the_drop_in_sets():
    from deploys.host_tuning import systemd_default_limits
    from facts.host import SystemdDefaultLimits

    want = systemd_default_limits(cfg())
    assert want == {"DefaultLimitMEMLOCK": "infinity", "DefaultLimitNOFILE": "1048576", "DefaultLimitSTACK": "67108864"}
    fact = SystemdDefaultLimits()
    assert fact.command(names=tuple(want)) == ("systemctl show -p DefaultLimitMEMLOCK -p DefaultLimitNOFILE "
                                               "-p DefaultLimitSTACK 2>/dev/null || true")
    # systemctl show's own order and form (systemd 257 on the sandbox nodes)
    assert fact.process(["DefaultLimitNOFILE=1048576", "DefaultLimitSTACK=67108864", "DefaultLimitMEMLOCK=infinity"]) == want
    assert fact.process([]) == {}  # no systemd as init: never equal, so the re-exec runs (and fails the host)
