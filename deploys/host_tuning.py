"""Host tuning: host-wide memlock/nofile/stack limits (opt-in), the UCX/NCCL env file, and the /dev/shm check.

The inference unit sets its own limits (`Limit*=`, the container's `--ulimit`). With `limits_host_wide` they
are also set for every process, two ways: pam_limits (limits.d) for login sessions, and systemd's manager
defaults for services (applied by a re-exec of PID 1).
"""

from __future__ import annotations

import posixpath
from io import StringIO

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, deploy
from pyinfra.facts.files import Directory, File

from deploys.run.reads import expect, operation, read
from deploys.inventory import node_config
from deploys.ops import directory_present, file_absent, atomic_put, fail_host, host_failed, secret_file, staged_path
from deploys.schema import NodeConfig
from deploys.unit_text import env_file_line
from facts.host import ManagedFiles, MountSizeBytes, SystemdDefaultLimits


LIMITS_FILE = "/etc/security/limits.d/90-inference-nodes.conf"
SYSTEMD_DEFAULTS_FILE = "/etc/systemd/system.conf.d/90-inference-nodes.conf"
HEADER = "# Managed by inference-nodes (deploys/host_tuning.py); local edits are overwritten.\n"


def render_limits(cfg: NodeConfig) -> str:
    """limits.d lines for every user and for root (pam_limits' `*` does not match root)."""
    values = {"memlock": cfg.memlock_limits_d, "nofile": str(cfg.limits_nofile), "stack": str(cfg.limits_stack // 1024)}
    lines = [HEADER, "# memlock and stack are in KiB here (systemd uses bytes).\n"]
    for domain in ("*", "root"):
        for item, value in values.items():
            for kind in ("soft", "hard"):
                lines.append(f"{domain}\t{kind}\t{item}\t{value}\n")
    return "".join(lines)


def systemd_default_limits(cfg: NodeConfig) -> dict[str, str]:
    """systemd's manager defaults for services, as the drop-in sets them and `systemctl show` shows them."""
    return {"DefaultLimitMEMLOCK": cfg.memlock_systemd, "DefaultLimitNOFILE": str(cfg.limits_nofile),
            "DefaultLimitSTACK": str(cfg.limits_stack)}


def render_systemd_defaults(cfg: NodeConfig) -> str:
    return f"{HEADER}[Manager]\n" + "".join(f"{k}={v}\n" for k, v in systemd_default_limits(cfg).items())


def render_fabric_env(cfg: NodeConfig) -> str:
    """KEY=value lines for the unit's `EnvironmentFile=` (Podman's `--env-file`: values verbatim)."""
    lines = [HEADER]
    if not cfg.fabric_env:
        lines.append("# no fabric settings for this node (single-node profile)\n")
    lines += [env_file_line(k, v) for k, v in sorted(cfg.fabric_env.items())]
    return "".join(lines)


def shm_problem(shm_bytes: int, need_bytes: int, reason: str) -> str | None:
    """Why /dev/shm is too small, or None."""
    if shm_bytes >= need_bytes:
        return None
    return (
        f"/dev/shm is {shm_bytes / 2**30:.1f} GiB; {reason} needs {need_bytes / 2**30:.1f} GiB: "
        "enlarge the tmpfs (fstab `size=`) or lower the KV offload"
    )


def host_shm_problem(cfg: NodeConfig, shm_bytes: int) -> str | None:
    """The one /dev/shm check of a node (preflight refuses the run with it, host tuning fails the host): why
    the host's /dev/shm of ``shm_bytes`` cannot hold what the container needs, or None. Only with --ipc=host is
    the host's the container's; otherwise it gets ShmSize=, which validation checked."""
    if not cfg.container_ipc_host:
        return None
    reason = f"kv_offload_gib {cfg.kv_offload_gib:g} + shm_headroom_gib {cfg.shm_headroom_gib:g}"
    return shm_problem(shm_bytes, cfg.shm_required_bytes, reason)


@operation()
def host_shm_large_enough():
    """Fail this host alone when its /dev/shm cannot hold what the container needs (:func:`host_shm_problem`);
    changes nothing."""
    cfg = node_config()
    if not cfg.container_ipc_host:
        host.noop(f"the container gets a /dev/shm of its own (ShmSize={cfg.shm_size_rendered})")
        return
    size = read(host, MountSizeBytes, path="/dev/shm")
    problem = host_shm_problem(cfg, size)
    if problem:
        yield fail_host(f"{host.name}: {problem}")
        return
    host.noop(f"/dev/shm is {size / 2**30:.1f} GiB (>= {cfg.shm_required_bytes / 2**30:.1f} GiB)")


def _manager_limits_problem(state, host, want: dict[str, str]) -> bool:
    have = read(host, SystemdDefaultLimits, names=tuple(want))  # read afresh: a command ran on the host
    wrong = {k: have.get(k) for k, v in want.items() if have.get(k) != v}
    if not wrong:
        return True
    expected = {k: want[k] for k in wrong}
    return host_failed(host, f"{host.name}: systemd re-executed but gives services {wrong}, not {expected} "
                             f"({SYSTEMD_DEFAULTS_FILE}): a later system.conf.d drop-in overrides it")


@operation()
def systemd_defaults_applied():
    """Re-execute systemd when its manager does not give services the limits of the drop-in. Decided from
    systemd's own state, not from the write's change: a run killed (or a re-exec failed) between writing the
    drop-in and the re-exec is completed by the next run. Fails the host when a re-exec does not bring them."""
    want = systemd_default_limits(node_config())
    if read(host, SystemdDefaultLimits, names=tuple(want)) == want:
        host.noop("systemd gives services the configured default limits")
        return
    yield StringCommand("systemctl", "daemon-reexec")
    yield FunctionCommand(_manager_limits_problem, (want,), {})


@deploy("Host tuning")
def host_tuning():
    cfg = node_config()
    batch = (LIMITS_FILE, SYSTEMD_DEFAULTS_FILE, cfg.fabric_env_file, staged_path(cfg.fabric_env_file))  # one trip
    limits = ([(SystemdDefaultLimits, {"names": tuple(systemd_default_limits(cfg))})] if cfg.limits_host_wide else
              [(File, {"path": p}) for p in (LIMITS_FILE, SYSTEMD_DEFAULTS_FILE)])
    expect([(MountSizeBytes, {"path": "/dev/shm"}), (ManagedFiles, {"paths": batch}), *limits,
            (Directory, {"path": posixpath.dirname(cfg.fabric_env_file)})])
    host_shm_large_enough(name="Check /dev/shm holds the KV offload")
    if cfg.limits_host_wide:
        atomic_put(
            batch=batch,
            name="Set memlock/nofile/stack limits for logins (limits.d)",
            src=StringIO(render_limits(cfg)),
            dest=LIMITS_FILE,
            user="root",
            group="root",
            mode="0644",
        )
        atomic_put(
            batch=batch,
            name="Set systemd's default memlock/nofile/stack limits for services",
            src=StringIO(render_systemd_defaults(cfg)),
            dest=SYSTEMD_DEFAULTS_FILE,
            user="root",
            group="root",
            mode="0644",
            create_remote_dir=True,
        )
        systemd_defaults_applied(name="Re-execute systemd so the new default limits apply")
    else:  # the unit's own limits suffice (Limit*= and the container's --ulimit)
        file_absent(name="Remove the login limits (limits.d; limits_host_wide is off)", path=LIMITS_FILE)
        file_absent(name="Remove systemd's default limits (limits_host_wide is off)", path=SYSTEMD_DEFAULTS_FILE)
    directory_present(
        name="Create the fabric env file's directory",
        path=posixpath.dirname(cfg.fabric_env_file),
        user="root",
        group="root",
        mode="0755",
    )
    # 0600: a value may be a secret (an NCCL/UCX setting with a credential in it). Staged beside the service's unit
    # and environment, where it differs: the service reads it at a start, so it goes in place with them, at the
    # service's switch (deploys/ops.py staged_path; the inference service deploy puts it in place)
    secret_file(
        batch=batch,
        name="Stage the UCX/NCCL fabric environment (0600, never printed)",
        src=StringIO(render_fabric_env(cfg)),
        dest=staged_path(cfg.fabric_env_file),
        same_as=cfg.fabric_env_file,
    )
