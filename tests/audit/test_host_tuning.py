"""Audit of host tuning: host-wide limits where the inventory asks for them (limits.d and systemd's service
defaults; absent otherwise: the unit sets its own), fabric env, /dev/shm.

Expected values come from the inventory's typed config, never from the deploy's own renderers.
Effective limits of running processes are not asserted: a sandbox node inherits its parent's hard caps
(nofile 20000, memlock 8 MiB on the CI host), so only configured values are comparable everywhere.
"""

import pytest

LIMITS_FILE = "/etc/security/limits.d/90-inference-nodes.conf"
SYSTEMD_DEFAULTS_FILE = "/etc/systemd/system.conf.d/90-inference-nodes.conf"


@pytest.fixture
def host_wide(node):
    if not node.cfg.limits_host_wide:
        pytest.skip("limits_host_wide is off: the unit sets its own (test_host_wide_limits_are_absent_when_off)")
    return node


def test_host_wide_limits_are_absent_when_off(node):
    if node.cfg.limits_host_wide:
        pytest.skip("limits_host_wide is on")
    for path in (LIMITS_FILE, SYSTEMD_DEFAULTS_FILE):
        assert not node.host.file(path).exists, f"{path} is on the node but limits_host_wide is off"


def _limits_entries(text: str) -> dict[tuple[str, str, str], str]:
    entries = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 4 and not fields[0].startswith("#"):
            domain, kind, item, value = fields
            entries[(domain, kind, item)] = value
    return entries


def test_limits_d_raises_memlock_nofile_stack_for_users_and_root(host_wide):
    node = host_wide
    f = node.host.file(LIMITS_FILE)
    assert f.is_file and f.user == "root" and f.mode == 0o644
    entries = _limits_entries(f.content_string)
    memlock = node.cfg.memlock_limits_d
    expected = {"memlock": memlock, "nofile": str(node.cfg.limits_nofile), "stack": str(node.cfg.limits_stack // 1024)}
    for domain in ("*", "root"):  # pam_limits' wildcard does not cover root
        for kind in ("soft", "hard"):
            for item, value in expected.items():
                assert entries.get((domain, kind, item)) == value, (domain, kind, item)


def test_systemd_default_limits_for_services(host_wide):
    node = host_wide
    shown = node.host.check_output("systemctl show -p DefaultLimitMEMLOCK -p DefaultLimitNOFILE -p DefaultLimitSTACK")
    props = dict(line.split("=", 1) for line in shown.splitlines())
    assert props == {
        "DefaultLimitMEMLOCK": node.cfg.memlock_systemd,
        "DefaultLimitNOFILE": str(node.cfg.limits_nofile),
        "DefaultLimitSTACK": str(node.cfg.limits_stack),
    }


def test_services_started_by_systemd_get_the_limits(host_wide):
    node = host_wide
    # sshd's unit sets no limits of its own, so it shows what every service without Limit*= gets.
    shown = node.host.check_output("systemctl show ssh.service -p LimitNOFILE -p LimitSTACK")
    props = dict(line.split("=", 1) for line in shown.splitlines())
    assert props == {"LimitNOFILE": str(node.cfg.limits_nofile), "LimitSTACK": str(node.cfg.limits_stack)}


def test_fabric_env_file(node):
    f = node.host.file(node.cfg.fabric_env_file)
    assert f.is_file and f.user == "root" and f.group == "root" and f.mode == 0o600  # values may be secrets
    values = {}
    for line in f.content_string.splitlines():
        if line and not line.startswith("#"):
            key, value = line.split("=", 1)
            values[key] = value
    assert values == node.cfg.fabric_env


def test_dev_shm_holds_the_kv_offload(node):
    if not node.cfg.container_ipc_host:
        pytest.skip("the container has a /dev/shm of its own (ShmSize=, checked inside it by the service audit)")
    size = int(node.host.check_output("df -P -B1 /dev/shm | awk 'NR==2 {print $2}'"))
    assert size >= node.cfg.shm_required_bytes
