"""The whole typed config of one node: every component's keys, the rules between components, and the
values derived from the keys (computed here once; deploys, renderers and audits read these).

Where a new key goes: in its component's module (deploys/schema/<component>.py, one ``*Keys`` class each,
listed in :data:`COMPONENT_KEYS`); a rule between two components' keys, or a value derived from several, here.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import model_validator

from deploys.schema.base import ComponentKeys, is_loopback_host
from deploys.schema.cluster import ClusterKeys
from deploys.schema.container import ContainerKeys
from deploys.schema.container_runtime import ContainerRuntimeKeys
from deploys.schema.endpoint import EndpointKeys
from deploys.schema.monitoring import MonitoringKeys
from deploys.schema.gate import GateKeys
from deploys.schema.host_tuning import HostTuningKeys
from deploys.schema.image import ImageKeys
from deploys.schema.model import ModelKeys
from deploys.schema.nvidia_driver import NvidiaDriverKeys
from deploys.schema.package_manager import PackageManagerKeys
from deploys.schema.rollout import RolloutKeys
from deploys.schema.base import KeyRuleError
from files.model_snapshot.snapshot_manifest import inside

NEEDLE_ANSWER_TOKENS = 16  # files/serving_gate/needle.py MAX_TOKENS (a script run on its own: not imported here)


class NodeConfig(ClusterKeys, ModelKeys, ImageKeys, ContainerKeys, HostTuningKeys, NvidiaDriverKeys,
                 ContainerRuntimeKeys, PackageManagerKeys, GateKeys, EndpointKeys, MonitoringKeys, RolloutKeys):
    """Every key for one node, validated. Derived values are properties."""

    @model_validator(mode="after")
    def _profile_gaps_name_keys(self) -> NodeConfig:
        for key in self.profile_gaps:
            if key not in NodeConfig.model_fields or key == "profile_gaps":
                raise KeyRuleError("profile_gaps", self.profile_gaps, f"keys of this schema (no key '{key}')")
        return self

    @model_validator(mode="after")
    def _endpoint_fronts_a_loopback_api(self) -> NodeConfig:
        """With the endpoint on, vLLM stays on loopback (the endpoint is the one way in). Ports: one table per host
        (deploys/schema/listeners.py)."""
        if not self.endpoint_enabled:
            return self
        if not ipaddress.ip_address(self.api_bind_address).is_loopback:
            raise KeyRuleError("api_bind_address", self.api_bind_address,
                               "a loopback address, since endpoint_enabled is true (the endpoint is the way in)")
        return self

    @model_validator(mode="after")
    def _writable_dirs_outside_model(self) -> NodeConfig:
        """The JIT and tmp directories are mounted writable: inside (or above) the model directory they
        would make the read-only snapshot writable from the container."""
        dirs = [(k, getattr(self, k)) for k in ("jit_cache_dir", "container_tmp_dir") if getattr(self, k)]
        for key, path in dirs:
            if inside(path, self.model_dir) or inside(self.model_dir, path):
                raise KeyRuleError(key, path, f"a directory outside the model directory {self.model_dir} (it is "
                                   "mounted writable)")
        if len(dirs) == 2 and (inside(dirs[0][1], dirs[1][1]) or inside(dirs[1][1], dirs[0][1])):
            raise KeyRuleError("container_tmp_dir", dirs[1][1], f"a directory apart from jit_cache_dir ({dirs[0][1]})")
        return self

    @model_validator(mode="after")
    def _owned_paths_apart(self) -> NodeConfig:
        """The directories the toolkit owns on the node neither coincide nor nest: the sync deletes what the
        manifest does not list in the model directory, `venv --clear` empties the hub venv, and the JIT and
        tmp directories are writable from the container (a writable venv or env file there would let the
        container change what root runs next). The one nesting that is the point: in the `hf_cache` layout the
        JIT and tmp directories may sit beside the repo's cache folder inside `model_root` (deployment A)."""
        owned = [("model_root", self.model_root), ("model_hub_venv", self.model_hub_venv),
                 ("jit_cache_dir", self.jit_cache_dir), ("container_tmp_dir", self.container_tmp_dir),
                 ("fabric_env_file", self.fabric_env_file)]
        owned = [(k, p) for k, p in owned if p]
        for i, (key, path) in enumerate(owned):
            for other_key, other in owned[:i]:
                if not (inside(path, other) or inside(other, path)):
                    continue
                if (other_key == "model_root" and key in ("jit_cache_dir", "container_tmp_dir")
                        and self.model_layout == "hf_cache" and inside(path, other)
                        and not (inside(path, self.model_dir) or inside(self.model_dir, path))):
                    continue
                raise KeyRuleError(key, path, f"a path apart from {other_key} ({other}): neither may contain the "
                                   "other (the toolkit deletes from, clears or mounts each on its own terms)")
        return self

    @model_validator(mode="after")
    def _token_never_in_clear(self) -> NodeConfig:
        from urllib.parse import urlsplit

        url = urlsplit(self.model_hub_endpoint)
        if self.model_hub_token_file and url.scheme == "http" and not is_loopback_host(url.hostname or ""):
            raise KeyRuleError("model_hub_endpoint", self.model_hub_endpoint,
                               "an https:// endpoint: a hub token is never sent over plain HTTP except to loopback")
        return self

    @model_validator(mode="after")
    def _container_shm_holds_what_it_needs(self) -> NodeConfig:
        have = self.container_shm_bytes
        if have is not None and have < self.shm_required_bytes:
            raise KeyRuleError("container_shm_size", self.container_shm_size,
                               f"at least {self.shm_required_bytes / 2**30:g} GiB: the container's /dev/shm "
                               f"holds kv_offload_gib {self.kv_offload_gib:g} + shm_headroom_gib "
                               f"{self.shm_headroom_gib:g} (or container_ipc_host: true to use the host's)")
        return self

    @model_validator(mode="after")
    def _service_env_agrees_with_keys(self) -> NodeConfig:
        offload = self.service_env.get("KV_OFFLOADING_SIZE")
        if offload is not None:
            try:
                matches = float(offload) == float(self.kv_offload_gib)
            except ValueError:
                matches = False
            if not matches:
                raise KeyRuleError(
                    "kv_offload_gib",
                    self.kv_offload_gib,
                    f"the same size as service_env KV_OFFLOADING_SIZE={offload} (the /dev/shm check relies on it)",
                )
        tp = self.service_env.get("TP_SIZE")
        if tp is not None and tp != str(self.tensor_parallel_size):
            raise KeyRuleError(
                "service_env", f"TP_SIZE={tp}", f"TP_SIZE equal to tensor_parallel_size ({self.tensor_parallel_size})"
            )
        return self

    @property
    def engine_max_num_seqs(self) -> int | None:
        """The sequences the engine runs at once where the profile says: `--max-num-seqs` of vllm_args, or the
        serving script's MAX_NUM_SEQS (service_env); None where neither does (vLLM's own default)."""
        value = self.vllm_flag("--max-num-seqs") or self.service_env.get("MAX_NUM_SEQS")
        return int(value) if value is not None and value.isdigit() and int(value) > 0 else None

    @property
    def key_concurrency(self) -> int:
        """What the endpoint lets one client have in flight (endpoint_key_concurrency, or its default)."""
        if self.endpoint_key_concurrency is not None:
            return self.endpoint_key_concurrency
        seqs = self.engine_max_num_seqs
        return max(1, seqs - 1) if seqs else 4

    @model_validator(mode="after")
    def _one_client_cannot_hold_every_sequence(self) -> NodeConfig:
        seqs, want = self.engine_max_num_seqs, self.endpoint_key_concurrency
        if not (self.endpoint_enabled and seqs and want is not None):
            return self
        if want >= seqs and not (seqs == 1 and want == 1):
            raise KeyRuleError("endpoint_key_concurrency", want,
                               f"below the engine's {seqs} sequences (--max-num-seqs / MAX_NUM_SEQS): one client "
                               "would hold every one, and every other client would wait" if seqs > 1 else
                               "1: the engine runs one sequence at a time")
        return self

    @model_validator(mode="after")
    def _gates_fit_the_server(self) -> NodeConfig:
        """A gate the server's own limits make fail every time is a wrong profile, not a failed node: K requests
        cannot all run under a smaller `--max-num-seqs`, nor a prompt exceed `--max-model-len`."""
        seqs, model_len = self.vllm_flag("--max-num-seqs"), self.vllm_flag("--max-model-len")
        if self.gate_concurrency and seqs and seqs.isdigit() and self.gate_concurrency > int(seqs):
            raise KeyRuleError("gate_concurrency", self.gate_concurrency,
                               f"at most --max-num-seqs {seqs} (vllm_args): the server runs no more requests at once")
        if not (model_len and model_len.isdigit()):
            return self
        if self.gate_concurrency and self.gate_concurrency_tokens >= int(model_len):
            raise KeyRuleError("gate_concurrency_tokens", self.gate_concurrency_tokens,
                               f"below --max-model-len {model_len} (vllm_args): prompt and completion share it")
        needle = self.gate_long_context_tokens
        if needle and needle + NEEDLE_ANSWER_TOKENS > int(model_len):
            raise KeyRuleError("gate_long_context_tokens", needle,
                               f"at most --max-model-len {model_len} (vllm_args) less the answer's "
                               f"{NEEDLE_ANSWER_TOKENS} tokens")
        return self

    @property
    def model_dir(self) -> str:
        """Host directory mounted into the container (the repo's cache folder, or the plain directory)."""
        if self.model_layout == "hf_cache":
            return f"{self.model_root}/hub/models--{self.model_repo.replace('/', '--')}"
        return self.model_root

    @property
    def snapshot_dir(self) -> str:
        """Host directory holding the files of the pinned commit."""
        if self.model_layout == "hf_cache":
            return f"{self.model_dir}/{self.snapshot_subdir}"
        return self.model_root

    @property
    def snapshot_subdir(self) -> str:
        """:attr:`snapshot_dir` relative to :attr:`model_dir` ("" in the plain layout)."""
        return f"snapshots/{self.model_revision}" if self.model_layout == "hf_cache" else ""

    @property
    def hub_download_dir(self) -> str:
        """Where huggingface_hub downloads in `hub` mode: its cache_dir (hf_cache), or the local_dir (plain)."""
        return f"{self.model_root}/hub" if self.model_layout == "hf_cache" else self.model_root

    @property
    def image_ref(self) -> str:
        return f"{self.image}@{self.image_digest}" if self.image_digest else self.image

    @property
    def shm_required_bytes(self) -> int:
        return int((self.kv_offload_gib + self.shm_headroom_gib) * 2**30)

    @property
    def container_shm_bytes(self) -> int | None:
        """The /dev/shm the container really gets: the host's with `--ipc=host` (None: checked on the node),
        else `ShmSize=` (:attr:`shm_size_rendered`)."""
        if self.container_ipc_host:
            return None
        number, unit = re.fullmatch(r"([0-9]+)([bkmg]?)", self.shm_size_rendered).groups()
        return int(number) * {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit]

    @property
    def shm_size_rendered(self) -> str | None:
        """`ShmSize=` of the unit: `container_shm_size`, or (unset, without host IPC) what the container
        needs rounded up to MiB, never Podman's 64 MiB default."""
        if self.container_ipc_host:
            return None
        return self.container_shm_size or f"{-(-self.shm_required_bytes // 2**20)}m"


COMPONENT_KEYS: dict[str, type[ComponentKeys]] = {
    "cluster": ClusterKeys,
    "model": ModelKeys,
    "image": ImageKeys,
    "container": ContainerKeys,
    "host_tuning": HostTuningKeys,
    "nvidia_driver": NvidiaDriverKeys,
    "container_runtime": ContainerRuntimeKeys,
    "package_manager": PackageManagerKeys,
    "serving_gate": GateKeys,
    "endpoint": EndpointKeys,
    "monitoring": MonitoringKeys,
    "rollout": RolloutKeys,
}


