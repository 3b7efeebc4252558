"""Host tuning keys: limits, fabric environment, /dev/shm (deploys/host_tuning.py)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import model_validator

from deploys.schema.base import ComponentKeys, EnvMap, FabricEnvFile, _key
from deploys.schema.base import KeyRuleError


class HostTuningKeys(ComponentKeys):
    """Limits, fabric environment and /dev/shm (deploys/host_tuning.py)."""

    limits_memlock: Literal["unlimited"] | int = _key(
        "unlimited", description="locked-memory limit in bytes or `unlimited` (RDMA and pinned host memory need it)"
    )
    limits_nofile: int = _key(1048576, description="open-files limit (soft = hard)", ge=1024, le=1048576)
    limits_stack: int = _key(67108864, description="stack size limit in bytes (soft = hard)", ge=8388608, le=2**40)
    limits_host_wide: bool = _key(
        False, description="also give these limits to every login (limits.d) and, as systemd's defaults, to every "
        "service (applied by a `daemon-reexec` of PID 1). The inference unit sets its own either way; only RDMA "
        "tools run by hand from a shell (nccl-tests, `ib_write_bw`: locked memory) need them. Off: files an "
        "earlier run wrote are removed (the manager keeps the raised defaults until its next boot; no re-exec)",
    )
    fabric_env: EnvMap = _key(
        {},
        description="UCX_*/NCCL_* settings written to `fabric_env_file` (e.g. `UCX_MEM_MMAP_HOOK_MODE`, `NCCL_IB_HCA`)",
    )
    fabric_env_file: FabricEnvFile = _key(
        "/etc/inference-nodes/fabric.env", description="env file the service reads for the fabric settings"
    )
    kv_offload_gib: float = _key(
        0, description="KV cache offloaded to an mmap file in /dev/shm (GiB, all ranks of the node)", ge=0, le=65536
    )
    shm_headroom_gib: float = _key(1, description="/dev/shm needed beyond the KV offload (NCCL, IPC buffers), GiB", ge=0, le=65536)

    @model_validator(mode="after")
    def _limits_and_fabric_env(self) -> HostTuningKeys:
        if isinstance(self.limits_memlock, int) and not 65536 <= self.limits_memlock <= 2**62:
            raise KeyRuleError("limits_memlock", self.limits_memlock, "'unlimited' or 65536 to 2^62 bytes")
        for name in self.fabric_env:
            if not re.fullmatch(r"(UCX|NCCL)_[A-Z0-9_]+", name):
                raise KeyRuleError("fabric_env", name, "only UCX_* and NCCL_* variables")
            if name == "NCCL_IB_GID_INDEX":
                raise KeyRuleError(
                    "fabric_env",
                    name,
                    "no NCCL_IB_GID_INDEX here: it is read from sysfs per node, or pinned with nccl_ib_gid_index",
                )
        return self

    # memlock in the three forms its three readers take (one home: every renderer and audit reads these)
    @property
    def memlock_limits_d(self) -> str:
        """limits.d's form: KiB, or `unlimited` (pam_limits)."""
        return "unlimited" if self.limits_memlock == "unlimited" else str(self.limits_memlock // 1024)

    @property
    def memlock_systemd(self) -> str:
        """systemd's form (`LimitMEMLOCK=`, `DefaultLimitMEMLOCK=`): bytes, or `infinity`."""
        return "infinity" if self.limits_memlock == "unlimited" else str(self.limits_memlock)

    @property
    def memlock_podman(self) -> str:
        """Podman's form (`--ulimit memlock=N:N`): bytes, or `-1`."""
        return "-1" if self.limits_memlock == "unlimited" else str(self.limits_memlock)
