"""Topology keys: which serving group a node belongs to and its place in it (rules across the
group's nodes: deploys/schema/cross_host.py)."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import model_validator

from deploys.schema.base import ComponentKeys, IpAddress, _key
from deploys.schema.base import KeyRuleError


class ClusterKeys(ComponentKeys):
    """Topology: which serving group a node belongs to and its place in it."""

    cluster_name: str = _key(
        description="serving group this node belongs to; nodes sharing it run one tensor-parallel job",
        min_length=1,
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
    )
    node_arch: Literal["x86_64", "aarch64"] = _key(
        description="CPU architecture the profile's image and driver are built for (`uname -m`)"
    )
    gpu_indices: list[int] = _key(
        [0], description="GPU indices this node serves with (CDI `nvidia.com/gpu=N`), unique"
    )
    tensor_parallel_size: int = _key(
        description="tensor-parallel size; must equal GPUs per node × nodes in the cluster", ge=1, le=4096
    )
    node_rank: int = _key(0, description="rank in a multi-node cluster: 0 is the head, 1..N-1 workers", ge=0, le=4095)
    fabric_address: IpAddress | None = _key(
        None,
        description="this node's address on the RoCE fabric (VLLM_HOST_IP; the head's is MASTER_ADDR); "
        "required in multi-node clusters",
    )
    fabric_on_one_host: bool = _key(
        False,
        description="the nodes share one machine's network (test sandboxes only): a loopback address other than "
        "127.0.0.1 and ::1 stands for a node's own (its fabric address, its node exporter's)",
    )
    nccl_ib_gid_index: int | None = _key(
        None,
        description="pin NCCL_IB_GID_INDEX; unset = read from sysfs when the service starts "
        "(it differs per node and moves after reboots)",
        ge=0, le=255,
    )
    profile_gaps: dict[str, str] = _key(
        {},
        description="keys the profile's write-up leaves open, each with where the write-up stops: while such a "
        "key is unset the host is refused (outside `--limit` it is left out)",
    )

    @model_validator(mode="after")
    def _gpu_indices_valid(self) -> ClusterKeys:
        """At least one, each 0..255, none twice."""
        if not self.gpu_indices:
            raise KeyRuleError("gpu_indices", self.gpu_indices, "at least one GPU index")
        if any(i < 0 or i > 255 for i in self.gpu_indices):
            raise KeyRuleError("gpu_indices", self.gpu_indices, "non-negative GPU indices up to 255")
        if len(set(self.gpu_indices)) != len(self.gpu_indices):
            raise KeyRuleError("gpu_indices", self.gpu_indices, "unique GPU indices")
        return self

    @model_validator(mode="after")
    def _fabric_address_is_unicast(self) -> ClusterKeys:
        if self.fabric_address is None:
            return self
        addr = ipaddress.ip_address(self.fabric_address)
        if (addr.is_unspecified or (addr.is_loopback and not self.fabric_on_one_host) or addr.is_multicast
                or addr == ipaddress.ip_address("255.255.255.255")):
            raise KeyRuleError("fabric_address", self.fabric_address,
                               "a unicast address of this node on the fabric (not unspecified, loopback, multicast "
                               "or broadcast: the other nodes must reach it)")
        return self

    @property
    def is_head(self) -> bool:
        """Rank 0: the node that serves the API and that the others join (`--master-addr`)."""
        return self.node_rank == 0
