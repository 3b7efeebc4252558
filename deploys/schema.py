"""The one typed schema for every inventory key a deploy reads.

Inventory data (host data, group data) flows: ``host.data`` -> :class:`NodeConfig` (validated, typed,
with derived values) -> deploys and audits. No deploy reads raw ``host.data`` past this module.

Keys are flat, component-prefixed pyinfra data keys (the pyinfra / Ansible-role convention). Each
component's keys live in one mixin below; :class:`NodeConfig` is their union. ``python -m deploys.schema``
prints the README's key table; a unit test keeps the README equal to it.

Rules that need the whole group (tensor-parallel size, ranks, head address) are checked by
:func:`validate_inventory`, which names host, key, bad value and what was expected for every problem.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
import unicodedata
from collections import defaultdict
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pyinfra.api.exceptions import DeployError

from files.model_snapshot.verify_snapshot import inside as _inside  # one definition of "at or below"

HEX40 = re.compile(r"[0-9a-f]{40}")  # patterns are used with fullmatch: `$` would accept a trailing newline
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _pyinfra_keys() -> frozenset[str]:
    """pyinfra's own host-data keys: every installed connector's data keys and the global arguments
    (`_sudo`, ...). host.data carries them beside ours; everything else must be a schema key, so a typo
    (`podman_min_versoin`) is an error, not a silently ignored value."""
    from importlib.metadata import entry_points

    from pyinfra.api.arguments import all_global_arguments

    keys = {name for name, _ in all_global_arguments() if name.startswith("_")}
    for ep in entry_points(group="pyinfra.connectors"):
        try:
            keys |= set(getattr(ep.load(), "data_meta", None) or {})
        except Exception:  # a broken third-party connector must not break validation
            continue
    return frozenset(keys)


PYINFRA_KEYS = _pyinfra_keys()

# Characters every consumer of a path handles without quoting surprises: Volume= (`:` separates),
# ExecStartPre= and shells (spaces, quotes, `%`, `$`), rsync (`:` means a remote), globbing.
_PATH = re.compile(r"/[A-Za-z0-9._+@=,/-]*")


def _absolute(value: str) -> str:
    if not PurePosixPath(value).is_absolute() or ".." in PurePosixPath(value).parts:
        raise ValueError("an absolute path without '..'")
    if not _PATH.fullmatch(value):
        raise ValueError("a path of letters, digits and . _ - + @ = , only (no spaces, ':', quotes, '%', '$', "
                         "control characters or non-ASCII: unit files, Volume= and rsync must read it back unchanged)")
    return str(PurePosixPath(value))


def _is_loopback_host(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


AbsPath = Annotated[str, AfterValidator(_absolute)]


def _env_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError("expected an environment variable name")
    return value


# Variable names that carry secrets belong in the secret-file keys, never in a unit or env file.
# Matched on the name's `_`-separated words: HF_TOKEN and DB_PASSWORD are secrets, MAX_NUM_BATCHED_TOKENS is not.
SECRET_NAME = re.compile(
    r"(?i)(.*[_-])?(TOKEN|PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIALS?|APIKEY|AUTH|COOKIE"
    r"|(API|PRIVATE|ACCESS|SECRET)[_-]KEY)([_-].*)?"
)


def _env_map(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        _env_name(name)
        if SECRET_NAME.fullmatch(name):
            raise ValueError(f"no {name}: a variable named like a secret would be written into a unit file "
                             "readable on the node; give secrets as files (model_hub_token_file, registry_auth_file)")
    return value


EnvMap = Annotated[dict[str, str], AfterValidator(_env_map)]


def _key(default: Any = ..., description: str = "", **kw: Any) -> Any:
    """A schema key: its default and the one-line meaning shown in the README table."""
    if not description:
        raise TypeError("every key needs a description")
    return Field(default, description=description, **kw)


def _private_control_file(key: str, path: str) -> None:
    """A secret on the control node: it exists, only its owner can read it, and it is not in the repo."""
    import os
    import stat

    if not os.path.isfile(path):
        raise _KeyError(key, path, "an existing file on the control node")
    if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise _KeyError(key, path, "mode 0600 (it is readable by group or others)")
    if os.path.realpath(path).startswith(os.path.realpath(os.getcwd()) + os.sep):
        raise _KeyError(key, path, "a path outside the repository (secrets are never committed)")


class _Keys(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)


class ClusterKeys(_Keys):
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
    fabric_address: str | None = _key(
        None,
        description="this node's address on the RoCE fabric (VLLM_HOST_IP; the head's is MASTER_ADDR); "
        "required in multi-node clusters",
    )
    fabric_on_one_host: bool = _key(
        False,
        description="the cluster's nodes share one machine's network (test sandboxes only): loopback fabric "
        "addresses are accepted",
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
    def _gpu_indices_unique(self) -> ClusterKeys:
        if not self.gpu_indices:
            raise _KeyError("gpu_indices", self.gpu_indices, "at least one GPU index")
        if any(i < 0 or i > 255 for i in self.gpu_indices):
            raise _KeyError("gpu_indices", self.gpu_indices, "non-negative GPU indices up to 255")
        if len(set(self.gpu_indices)) != len(self.gpu_indices):
            raise _KeyError("gpu_indices", self.gpu_indices, "unique GPU indices")
        return self

    @model_validator(mode="after")
    def _profile_gaps_name_keys(self) -> ClusterKeys:
        for key in self.profile_gaps:
            if key not in NodeConfig.model_fields or key == "profile_gaps":
                raise _KeyError("profile_gaps", self.profile_gaps, f"keys of this schema (no key '{key}')")
        return self

    @model_validator(mode="after")
    def _fabric_address_is_unicast(self) -> ClusterKeys:
        if self.fabric_address is None:
            return self
        try:
            addr = ipaddress.ip_address(self.fabric_address)
        except ValueError:
            raise _KeyError("fabric_address", self.fabric_address, "an IPv4 or IPv6 address") from None
        if (addr.is_unspecified or (addr.is_loopback and not self.fabric_on_one_host) or addr.is_multicast
                or addr == ipaddress.ip_address("255.255.255.255")):
            raise _KeyError("fabric_address", self.fabric_address,
                            "a unicast address of this node on the fabric (not unspecified, loopback, multicast "
                            "or broadcast: the other nodes must reach it)")
        if str(addr) != self.fabric_address:
            raise _KeyError("fabric_address", self.fabric_address, f"the address in canonical form ({addr})")
        return self


class ModelKeys(_Keys):
    """The model snapshot: what, at which commit, where on disk."""

    model_repo: str = _key(
        description="hub repository id (`org/name`)", pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$"
    )
    model_revision: str = _key(description="the pinned 40-hex commit of `model_repo` (never a branch or tag)")
    model_root: AbsPath = _key(
        description="directory holding the snapshot: the HF cache root (`hf_cache`) or the files themselves (`plain`)"
    )
    model_layout: Literal["hf_cache", "plain"] = _key(
        "hf_cache",
        description="`hf_cache`: `<root>/hub/models--org--name/snapshots/<commit>`; `plain`: the files in `model_root`",
    )
    model_size_gb: float = _key(
        167.0,
        description="disk the complete snapshot needs (GB, 10^9 bytes); preflight checks free space against "
        "what is still missing",
        gt=0, le=100_000,
    )

    model_manifest: str | None = _key(
        None,
        description="trusted manifest: `files/manifests/<org>--<name>@<commit>.json` (committed after review) or an "
        "absolute control-node path; its repo/commit must be `model_repo`/`model_revision`",
    )
    model_sync_mode: Literal["hub", "push", "present"] = _key(
        "push",
        description="`hub`: each node downloads with huggingface_hub; `push`: the control node downloads once, "
        "verifies, rsyncs what each node lacks; `present`: only verify",
    )
    model_hub_venv: AbsPath = _key(
        "/opt/inference-nodes/hub-venv",
        description="venv the `hub` mode manages on the node (the pinned huggingface_hub, wheels pushed from the "
        "control node)",
    )
    model_hub_endpoint: str = _key("https://huggingface.co", description="hub URL (HF_ENDPOINT)",
                                   pattern=r"^https?://\S+$")
    model_hub_token_file: AbsPath | None = _key(
        None, description="control-node file holding a hub token (outside the repo, 0600); never printed"
    )
    model_control_cache: AbsPath = _key(
        "/var/cache/inference-nodes/hub", description="control-node HF cache the `push` mode downloads into"
    )
    model_rsync_streams: int = _key(4, description="parallel rsync streams per node in `push` mode", ge=1, le=16)
    model_push_fanout: int = _key(
        2,
        description="`push` mode: nodes each holder feeds per wave; the control node feeds the first this many of a "
        "group, then every node holding a verified copy feeds this many more (node to node)",
        ge=1, le=16,
    )
    model_peer_address: str | None = _key(
        None,
        description="address this node serves its verified copy to peers on during a `push` fan-out "
        "(default: the SSH host; set a faster network that every node of the group can reach)",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.:-]*$",
    )
    model_peer_port: int = _key(873, description="TCP port of that transient read-only rsync daemon", ge=1, le=65535)
    model_verify_full: bool = _key(
        False,
        description="re-hash every file in this converge even when the stamp matches (`--data model_verify_full=true`); "
        "a node with no deep-verify record gets a full re-hash anyway",
    )
    model_deep_verify_every: Literal["daily", "weekly", "monthly"] = _key(
        "weekly",
        description="how often the node's timer (`inference-nodes-model-verify.timer`) re-hashes every file against "
        "the manifest; the audit fails when the last deep verify is older than this plus the window and 12 h",
    )
    model_deep_verify_at: str = _key(
        "03:00",
        description="start of the deep verify's window, node local time `HH:MM` (weekly: Sundays; monthly: the 1st)",
        pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$",
    )
    model_deep_verify_window_h: int = _key(
        4, description="the start is spread at random over this many hours, so a cluster's nodes do not all read "
        "at once (systemd `RandomizedDelaySec=`)", ge=0, le=23,
    )
    model_deep_verify_max_mbps: int | None = _key(
        None,
        description="read-rate cap of the deep verify in MB/s (all threads); it runs at nice 19, idle IO class and "
        "drops the files it read from the page cache either way",
        ge=10, le=100_000,
    )
    model_deep_verify_on_mismatch: Literal["stop", "keep_serving"] = _key(
        "stop",
        description="a bad file found by the deep verify (it is named in the journal and the stamp removed): `stop` "
        "stops the service; `keep_serving` keeps serving what it loaded. Either way it cannot start again until a "
        "converge repairs the snapshot, and the converge restarts it",
    )

    @model_validator(mode="after")
    def _revision_is_commit(self) -> ModelKeys:
        if not HEX40.fullmatch(self.model_revision):
            raise _KeyError("model_revision", self.model_revision, "a 40-hex commit id (lower case)")
        if self.model_manifest is not None:
            from deploys.model_manifest import ManifestError, read_manifest

            try:  # shape and every entry: relative, normalised, inside the snapshot, no duplicates
                manifest = read_manifest(self.model_manifest)
            except ManifestError as e:
                raise _KeyError("model_manifest", self.model_manifest, f"a valid manifest ({e})") from None
            if (manifest.get("repo"), manifest.get("commit")) != (self.model_repo, self.model_revision):
                raise _KeyError(
                    "model_manifest", self.model_manifest,
                    f"a manifest of {self.model_repo}@{self.model_revision}, not "
                    f"{manifest.get('repo')}@{manifest.get('commit')}",
                )
        if self.model_hub_token_file is not None:
            _private_control_file("model_hub_token_file", self.model_hub_token_file)
        return self


class ImageKeys(_Keys):
    """The container image the service runs."""

    image: str = _key(
        description="image reference without digest, e.g. `registry.home.arpa/vllm:deepseek-v4`",
        pattern=r"^[a-z0-9][a-z0-9._/:@-]*$",
    )
    image_digest: str | None = _key(None, description="manifest digest the image is pinned to (`sha256:<64 hex>`)")
    image_upstream: str | None = _key(
        None, description="where a mirrored image came from (documentation only; never pulled)"
    )
    allow_unpinned_image: bool = _key(
        False, description="accept an image without `image_digest` (not reproducible; off by default)"
    )

    @model_validator(mode="after")
    def _pinned(self) -> ImageKeys:
        if "@" in self.image:
            raise _KeyError("image", self.image, "a reference without '@digest' (put the digest in image_digest)")
        if self.image_digest is not None and not DIGEST.fullmatch(self.image_digest):
            raise _KeyError("image_digest", self.image_digest, "'sha256:' followed by 64 lower-case hex digits")
        if self.image_digest is None and not self.allow_unpinned_image:
            raise _KeyError(
                "image_digest", None, "a pinned digest (or set allow_unpinned_image: true to accept a moving tag)"
            )
        return self


# The service is `<container_name>.service`: it must not be a unit the node or this toolkit already has.
RESERVED_UNIT_NAMES = frozenset({
    "nvidia-cdi-refresh", "nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "podman",
    "podman-auto-update", "podman-restart", "podman-clean-transient", "ssh", "sshd", "dbus", "cron", "rsync",
    "docker", "containerd", "unattended-upgrades", "apt-daily", "apt-daily-upgrade", "networking", "network",
    "getty", "init", "user", "default", "multi-user", "emergency", "rescue", "reboot", "shutdown",
})
RESERVED_UNIT_PREFIXES = ("systemd-", "inference-nodes", "nvidia-", "podman-", "apt-", "dpkg", "user-")
SYSTEM_DIRS = frozenset({"/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/var", "/run", "/boot", "/root"})

# vLLM flags the unit derives from typed keys (`cli` launch); giving one in vllm_args is a validation error.
DERIVED_VLLM_FLAGS = {
    "--model": "the snapshot as mounted (model_mount, model_revision)",
    "--served-model-name": "served_model_name",
    "--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
    "--nnodes": "the cluster's size", "-n": "the cluster's size",
    "--node-rank": "node_rank", "-r": "node_rank",
    "--master-addr": "the head's fabric_address", "--master-port": "vllm_master_port",
    "--headless": "node_rank > 0",
    "--speculative-config": "vllm_speculative_config", "-sc": "vllm_speculative_config",
    "--host": "api_bind_address", "--port": "api_port",
}


SECRET_VLLM_FLAGS = frozenset({"--api-key", "--api_key", "--hf-token", "--hf_token"})


def derived_vllm_flag(arg: str) -> str | None:
    """The derived flag ``arg`` spells (vLLM's parser also accepts `--x_y` and `--x=v`), else None."""
    if not arg.startswith("-"):
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name if name in DERIVED_VLLM_FLAGS else None


class ContainerKeys(_Keys):
    """How the container is run (Quadlet `[Container]`)."""

    container_name: str = _key(
        "inference", description="container and systemd service name (not a system or toolkit unit's name)",
        pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$",
    )
    container_exec: str | None = _key(None, description="command the container runs (Quadlet `Exec=`); unset = image default")
    container_privileged: bool = _key(False, description="run `--privileged` (deployment A did; least privilege otherwise)")
    container_ipc_host: bool = _key(False, description="share the host's IPC namespace (`--ipc=host`); excludes `container_shm_size`")
    container_shm_size: str | None = _key(
        None, description="container /dev/shm size (`ShmSize=`, e.g. `16g`); unset without `container_ipc_host`: "
        "`kv_offload_gib + shm_headroom_gib` (never Podman's 64 MiB default); Podman refuses it with `--ipc=host`",
        pattern=r"^[0-9]+[bkmg]?$",
    )
    container_devices: list[AbsPath] = _key(
        [], description="host devices passed into the container (`AddDevice=`): `/dev/infiniband` for NCCL's "
        "RoCE/InfiniBand transport; preflight refuses a node that lacks one",
    )
    service_env: EnvMap = _key({}, description="environment of the serving process (deployment A's image builds vLLM args from it)")
    vllm_launch: Literal["cli", "image_env"] = _key(
        "cli",
        description="`cli`: the unit renders vLLM's whole command line from typed keys (B, C); `image_env`: the "
        "image's script (`container_exec`) builds it from `service_env` (A's `serve-ds4-flash.sh`)",
    )
    vllm_command: list[str] = _key(
        ["vllm", "serve"],
        description="`cli` launch: what `Exec=` puts before the model path; `[]` when the image's entrypoint "
        "already is `vllm serve`",
    )
    vllm_python: str = _key(
        "python3", description="interpreter in the image that imports vLLM (the argument check before a unit changes)",
        pattern=r"^[A-Za-z0-9_./-]+$",
    )
    served_model_name: str | None = _key(
        None, description="name clients ask for (`--served-model-name` / `SERVED_MODEL_NAME`); unset = the model path",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
    )
    vllm_master_port: int = _key(
        29500, description="multi-node clusters: the head's torch.distributed port (`--master-port`)", ge=1, le=65535
    )
    vllm_speculative_config: dict[str, Any] | None = _key(
        None, description="`cli` launch: speculative decoding, rendered as `--speculative-config <JSON>` (vLLM's "
        "SpeculativeConfig: `method`, `num_speculative_tokens`, ...); an external draft `model` must be pinned by a "
        "40-hex `revision`",
    )
    vllm_args: list[str] = _key([], description="extra vLLM flags after the derived ones (`cli` launch only)")
    model_mount: AbsPath = _key("/models", description="where the model directory is mounted read-only in the container")
    jit_cache_dir: AbsPath | None = _key(None, description="host directory for the persistent JIT cache")
    jit_cache_mount: AbsPath = _key("/cache", description="mount point of `jit_cache_dir` in the container")
    container_tmp_dir: AbsPath | None = _key(None, description="host directory for the container's persistent tmp")
    container_tmp_mount: AbsPath = _key("/container-tmp", description="mount point of `container_tmp_dir` in the container")
    api_bind_address: str = _key("127.0.0.1", description="address the API listens on; loopback unless fronted by an authenticating proxy")
    api_port: int = _key(8000, description="API port", ge=1, le=65535)
    api_protected_by: str | None = _key(
        None, description="how a non-loopback API is protected (required when `api_bind_address` is not loopback)"
    )
    roce_sysfs_root: AbsPath = _key(
        "/sys", description="sysfs the RoCE GID lookup reads at service start (`/sys`; the sandbox has a stand-in tree)"
    )
    service_timeout_start_sec: int = _key(3600, description="`TimeoutStartSec=`: first start compiles and loads ~160 GB", ge=1, le=7 * 86400)
    service_timeout_stop_sec: int = _key(120, description="`TimeoutStopSec=`", ge=1, le=86400)
    service_restart_sec: int = _key(30, description="`RestartSec=` after a failure", ge=0, le=86400)
    service_worker_grace_sec: int = _key(
        120, description="multi-node workers: seconds after start before a head that does not answer on "
        "`vllm_master_port` gets the worker killed and restarted (`HealthStartPeriod=`)", ge=10, le=86400,
    )

    @model_validator(mode="after")
    def _launch_rules(self) -> ContainerKeys:
        for key, words in (("vllm_command", self.vllm_command), ("vllm_args", self.vllm_args),
                           ("container_exec", shlex.split(self.container_exec or ""))):
            if "" in words:
                raise _KeyError(key, words, "no empty arguments: Podman's Quadlet drops an empty word of Exec= "
                                "and every argument after it")
        if self.vllm_launch == "image_env":
            if not self.container_exec:
                raise _KeyError("container_exec", None, "the image's serving script, since vllm_launch is image_env")
            if self.vllm_speculative_config is not None:
                raise _KeyError("vllm_speculative_config", self.vllm_speculative_config,
                                "unset with vllm_launch image_env (the image's script sets speculative decoding "
                                "from service_env)")
            if self.vllm_args:
                raise _KeyError("vllm_args", self.vllm_args,
                                "no flags with vllm_launch image_env (the image's script builds vLLM's arguments "
                                "from service_env)")
            derived = {"SERVED_MODEL_NAME": self.served_model_name, "PORT": str(self.api_port)}
            for name, want in derived.items():
                have = self.service_env.get(name)
                if have is not None and want is not None and have != want:
                    key = "served_model_name" if name == "SERVED_MODEL_NAME" else "api_port"
                    raise _KeyError("service_env", f"{name}={have}", f"{name} equal to {key} ({want})")
        else:
            if self.container_exec:
                raise _KeyError("container_exec", self.container_exec,
                                "unset with vllm_launch cli (the command is vllm_command + derived flags + vllm_args)")
            for arg in self.vllm_args:
                if arg.split("=", 1)[0] in SECRET_VLLM_FLAGS or looks_secret(arg):
                    raise _KeyError("vllm_args", arg, "no secrets on the command line (it is in the unit file and "
                                    "in `ps`): the API stays on loopback behind an authenticating proxy; hub "
                                    "tokens go in model_hub_token_file")
                flag = derived_vllm_flag(arg)
                if flag:
                    raise _KeyError("vllm_args", arg,
                                    f"no {flag}: the toolkit derives it ({DERIVED_VLLM_FLAGS[flag]})")
        return self

    @model_validator(mode="after")
    def _speculative_config(self) -> ContainerKeys:
        spec = self.vllm_speculative_config
        if spec is None:
            return self
        if not isinstance(spec.get("method"), str) or not re.fullmatch(r"[a-z0-9_]+", spec["method"]):
            raise _KeyError("vllm_speculative_config", spec, "a `method` (e.g. mtp, eagle3, draft_model)")
        tokens = spec.get("num_speculative_tokens")
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or not 1 <= tokens <= 64):
            raise _KeyError("vllm_speculative_config", spec, "num_speculative_tokens a whole number from 1 to 64")
        if "model" in spec and not (isinstance(spec.get("revision"), str) and HEX40.fullmatch(spec["revision"])):
            raise _KeyError("vllm_speculative_config", spec,
                            "a 40-hex `revision` beside the external draft `model`: a re-uploaded drafter changes "
                            "what is served (seed 003)")
        try:
            json.dumps(spec, allow_nan=False)
        except (TypeError, ValueError):
            raise _KeyError("vllm_speculative_config", spec, "plain JSON values (strings, numbers, booleans, "
                            "lists, objects)") from None
        return self

    @model_validator(mode="after")
    def _mounts_distinct(self) -> ContainerKeys:
        """The container's mounts neither coincide nor nest (a writable mount inside the read-only model
        mount would make part of it writable), and none covers a directory the image itself needs."""
        mounts = [("model_mount", self.model_mount)]
        if self.jit_cache_dir:
            mounts.append(("jit_cache_mount", self.jit_cache_mount))
        if self.container_tmp_dir:
            mounts.append(("container_tmp_mount", self.container_tmp_mount))
        for key, mount in mounts:
            if mount in SYSTEM_DIRS or any(_inside(mount, d) for d in ("/proc", "/sys", "/dev")):
                raise _KeyError(key, mount, "a mount point of its own, not / or a system directory of the image")
        for i, (key, mount) in enumerate(mounts):
            for other_key, other in mounts[:i]:
                if _inside(mount, other) or _inside(other, mount):
                    raise _KeyError(key, mount, f"a mount point apart from {other_key} ({other}): neither may "
                                    "contain the other")
        return self

    @model_validator(mode="after")
    def _container_rules(self) -> ContainerKeys:
        if self.container_name in RESERVED_UNIT_NAMES or self.container_name.startswith(RESERVED_UNIT_PREFIXES):
            raise _KeyError("container_name", self.container_name,
                            "a name of its own: the service would replace or shadow a system or toolkit unit")
        if self.container_ipc_host and self.container_shm_size is not None:
            raise _KeyError(
                "container_shm_size",
                self.container_shm_size,
                "unset while container_ipc_host is true (Podman refuses --ipc=host with a shm size)",
            )
        try:
            bind = ipaddress.ip_address(self.api_bind_address)
        except ValueError:
            raise _KeyError("api_bind_address", self.api_bind_address, "an IP address") from None
        if not bind.is_loopback and not (self.api_protected_by or "").strip():
            raise _KeyError(
                "api_protected_by",
                self.api_protected_by,
                f"a description of the authenticating proxy, since api_bind_address is {self.api_bind_address} "
                "(not loopback)",
            )
        return self


class HostTuningKeys(_Keys):
    """Limits, fabric environment and /dev/shm (deploys/host_tuning.py)."""

    limits_memlock: Literal["unlimited"] | int = _key(
        "unlimited", description="locked-memory limit in bytes or `unlimited` (RDMA and pinned host memory need it)"
    )
    limits_nofile: int = _key(1048576, description="open-files limit (soft = hard)", ge=1024, le=1048576)
    limits_stack: int = _key(67108864, description="stack size limit in bytes (soft = hard)", ge=8388608, le=2**40)
    fabric_env: EnvMap = _key(
        {},
        description="UCX_*/NCCL_* settings written to `fabric_env_file` (e.g. `UCX_MEM_MMAP_HOOK_MODE`, `NCCL_IB_HCA`)",
    )
    fabric_env_file: AbsPath = _key(
        "/etc/inference-nodes/fabric.env", description="env file the service reads for the fabric settings"
    )
    kv_offload_gib: float = _key(
        0, description="KV cache offloaded to an mmap file in /dev/shm (GiB, all ranks of the node)", ge=0, le=65536
    )
    shm_headroom_gib: float = _key(1, description="/dev/shm needed beyond the KV offload (NCCL, IPC buffers), GiB", ge=0, le=65536)

    @model_validator(mode="after")
    def _fabric_rules(self) -> HostTuningKeys:
        if isinstance(self.limits_memlock, int) and not 65536 <= self.limits_memlock <= 2**62:
            raise _KeyError("limits_memlock", self.limits_memlock, "'unlimited' or 65536 to 2^62 bytes")
        for name in self.fabric_env:
            if not re.fullmatch(r"(UCX|NCCL)_[A-Z0-9_]+", name):
                raise _KeyError("fabric_env", name, "only UCX_* and NCCL_* variables")
            if name == "NCCL_IB_GID_INDEX":
                raise _KeyError(
                    "fabric_env",
                    name,
                    "no NCCL_IB_GID_INDEX here: it is read from sysfs per node, or pinned with nccl_ib_gid_index",
                )
        return self


class NvidiaDriverKeys(_Keys):
    """The NVIDIA driver, its source and how it is held (deploys/nvidia_driver.py)."""

    nvidia_driver_source: Literal["cuda_repo", "ubuntu_archive", "preinstalled"] = _key(
        "cuda_repo",
        description="where the driver comes from: NVIDIA's CUDA apt repo, the Ubuntu archive, or `preinstalled` "
        "(DGX OS: install nothing, verify and hold)",
    )
    nvidia_driver_branch: str = _key("580", description="driver branch to install and hold", pattern=r"^[0-9]{3}$")
    nvidia_driver_open: bool = _key(True, description="open kernel modules (required by Blackwell and GB10)")
    nvidia_driver_packages: list[str] | None = _key(
        None, description="packages to install; unset = the source's default set for branch and flavour"
    )
    nvidia_repo_url: str = _key(
        "https://developer.download.nvidia.com/compute/cuda/repos",
        description="base of NVIDIA's CUDA apt repo; `/<distro>/<arch>/` (e.g. `ubuntu2404/sbsa`) is appended",
        pattern=r"^(https?|file)://\S+$",
    )
    nvidia_repo_key_url: str = _key(
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/3bf863cc.pub",
        description="signing key of the CUDA repo, fetched on the node and checked against the fingerprint",
        pattern=r"^(https?|file)://\S+$",
    )
    nvidia_repo_key_fingerprint: str = _key(
        "EB693B3035CD5710E231E123A4B469963BF863CC",
        description="full fingerprint the repo key must have (40 hex); a different key is refused",
        pattern=r"^[0-9A-F]{40}$",
    )
    allow_driver_change: bool = _key(
        False, description="move a host that runs another driver branch to `nvidia_driver_branch` (else refused)"
    )
    allow_reboot: bool = _key(
        False,
        description="reboot when the loaded module differs from the installed driver (else the host is stopped "
        "and reported)",
    )
    nvidia_kernel_hold: str | None = _key(
        None, description="kernel release to hold (`uname -r` form, e.g. `6.17.0-1031-nvidia`; GB10 nodes)",
        pattern=r"^[0-9][0-9A-Za-z.+~-]*$",
    )
    nvidia_module_root: AbsPath = _key(
        "/", description="where `sys/module/nvidia` and `proc/driver/nvidia` are read (`/`; the sandbox's stand-in differs)"
    )

    @model_validator(mode="after")
    def _driver_rules(self) -> NvidiaDriverKeys:
        if self.nvidia_driver_packages is not None and self.nvidia_driver_source == "preinstalled":
            raise _KeyError(
                "nvidia_driver_packages", self.nvidia_driver_packages, "unset with nvidia_driver_source preinstalled"
            )
        for name in self.nvidia_driver_packages or []:
            if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", name):
                raise _KeyError("nvidia_driver_packages", name, "Debian package names (no version: the branch pins it)")
        return self

    @property
    def driver_packages(self) -> list[str]:
        """What to install for this source, branch and flavour (empty for preinstalled)."""
        if self.nvidia_driver_packages is not None:
            return list(self.nvidia_driver_packages)
        b = self.nvidia_driver_branch
        if self.nvidia_driver_source == "cuda_repo":
            # NVIDIA's recommended order: the branch pinning package, then the unversioned driver metapackage.
            return [f"nvidia-driver-pinning-{b}", "nvidia-open" if self.nvidia_driver_open else "cuda-drivers"]
        if self.nvidia_driver_source == "ubuntu_archive":
            flavour = "-open" if self.nvidia_driver_open else ""
            return [f"nvidia-headless-{b}-server{flavour}", f"nvidia-utils-{b}-server"]
        return []


class RegistryMirror(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    location: str = Field(pattern=r"^[A-Za-z0-9][\w.:/-]*$")
    insecure: bool = False


class Registry(BaseModel):
    """One `[[registry]]` of containers-registries.conf(5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    prefix: str = Field(pattern=r"^[A-Za-z0-9][\w.:/-]*$")
    location: str | None = Field(None, pattern=r"^[A-Za-z0-9][\w.:/-]*$")
    insecure: bool = False
    mirrors: list[RegistryMirror] = []


class ContainerRuntimeKeys(_Keys):
    """Podman, the NVIDIA container toolkit, CDI, registries, the image pull (deploys/container_runtime.py)."""

    podman_min_version: str = _key("4.9.3", description="oldest Podman accepted (Ubuntu 24.04 ships 4.9.3)",
                                   pattern=r"^[0-9]+(\.[0-9]+){1,2}$")
    nvidia_toolkit_version: str = _key(
        "1.18.2-1",
        description="NVIDIA container toolkit version (Debian version), installed exactly and held; >= 1.18 "
        "(the CDI refresh unit)",
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.~+]+)?$",
    )
    nvidia_toolkit_packages: list[str] = _key(
        ["nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
         "libnvidia-container1"],
        description="toolkit packages, all installed at `nvidia_toolkit_version`",
    )
    nvidia_toolkit_repo_url: str = _key(
        "https://nvidia.github.io/libnvidia-container/stable/deb",
        description="NVIDIA's toolkit apt repo; `/<dpkg arch>/` is appended", pattern=r"^(https?|file)://\S+$",
    )
    nvidia_toolkit_key_url: str = _key(
        "https://nvidia.github.io/libnvidia-container/gpgkey", description="signing key of the toolkit repo",
        pattern=r"^(https?|file)://\S+$",
    )
    nvidia_toolkit_key_fingerprint: str = _key(
        "C95B321B61E88C1809C4F759DDCAE044F796ECB0", description="full fingerprint the toolkit repo key must have",
        pattern=r"^[0-9A-F]{40}$",
    )
    cdi_no_additional_gids: bool = _key(
        True, description="generate CDI specs without `additionalGids` (Podman < 5.1 cannot read them; toolkit >= 1.19 "
        "adds them otherwise)",
    )
    cdi_spec_path: AbsPath = _key(
        "/var/run/cdi/nvidia.yaml", description="the one CDI spec, written by the toolkit's nvidia-cdi-refresh unit"
    )
    registries: list[Registry] = _key(
        [], description="registries.conf.d entries: `{prefix, location, insecure, mirrors: [{location, insecure}]}`"
    )
    registry_auth_file: AbsPath | None = _key(
        None, description="control-node path of a registry auth.json (outside the repo, mode 0600); copied to the "
        "node 0600, never printed",
    )

    @model_validator(mode="after")
    def _runtime_rules(self) -> ContainerRuntimeKeys:
        from packaging.version import Version

        if Version(self.nvidia_toolkit_version.split("-")[0]) < Version("1.18"):
            raise _KeyError("nvidia_toolkit_version", self.nvidia_toolkit_version,
                            ">= 1.18 (older toolkits have no nvidia-cdi-refresh unit)")
        if self.registry_auth_file is not None:
            _private_control_file("registry_auth_file", self.registry_auth_file)
        return self

    @property
    def toolkit_minor(self) -> tuple[int, int]:
        major, minor = self.nvidia_toolkit_version.split(".")[:2]
        return int(major), int(minor)


class PackageManagerKeys(_Keys):
    """apt and dpkg under real conditions (deploys/apt_state.py)."""

    apt_lock_timeout_s: int = _key(
        600,
        description="how long every apt/dpkg command waits for another package run (unattended-upgrades on "
        "first boot) to release its lock before the host fails, naming the holder",
        ge=0, le=86400,
    )


class NodeConfig(ClusterKeys, ModelKeys, ImageKeys, ContainerKeys, HostTuningKeys, NvidiaDriverKeys,
                 ContainerRuntimeKeys, PackageManagerKeys):
    """Every key for one node, validated. Derived values are properties."""

    @model_validator(mode="after")
    def _writable_dirs_outside_model(self) -> NodeConfig:
        """The JIT and tmp directories are mounted writable: inside (or above) the model directory they
        would make the read-only snapshot writable from the container."""
        dirs = [(k, getattr(self, k)) for k in ("jit_cache_dir", "container_tmp_dir") if getattr(self, k)]
        for key, path in dirs:
            if _inside(path, self.model_dir) or _inside(self.model_dir, path):
                raise _KeyError(key, path, f"a directory outside the model directory {self.model_dir} (it is "
                                "mounted writable)")
            if path in SYSTEM_DIRS:
                raise _KeyError(key, path, "a directory of its own, not a system directory")
        if len(dirs) == 2 and (_inside(dirs[0][1], dirs[1][1]) or _inside(dirs[1][1], dirs[0][1])):
            raise _KeyError("container_tmp_dir", dirs[1][1], f"a directory apart from jit_cache_dir ({dirs[0][1]})")
        return self

    @model_validator(mode="after")
    def _token_never_in_clear(self) -> NodeConfig:
        from urllib.parse import urlsplit

        url = urlsplit(self.model_hub_endpoint)
        if self.model_hub_token_file and url.scheme == "http" and not _is_loopback_host(url.hostname or ""):
            raise _KeyError("model_hub_endpoint", self.model_hub_endpoint,
                            "an https:// endpoint: a hub token is never sent over plain HTTP except to loopback")
        return self

    @model_validator(mode="after")
    def _container_shm_holds_what_it_needs(self) -> NodeConfig:
        have = self.container_shm_bytes
        if have is not None and have < self.shm_required_bytes:
            raise _KeyError("container_shm_size", self.container_shm_size,
                            f"at least {self.shm_required_bytes / 2**30:g} GiB: the container's /dev/shm "
                            f"holds kv_offload_gib {self.kv_offload_gib:g} + shm_headroom_gib "
                            f"{self.shm_headroom_gib:g} (or container_ipc_host: true to use the host's)")
        return self

    @model_validator(mode="after")
    def _cross_component(self) -> NodeConfig:
        offload = self.service_env.get("KV_OFFLOADING_SIZE")
        if offload is not None:
            try:
                matches = float(offload) == float(self.kv_offload_gib)
            except ValueError:
                matches = False
            if not matches:
                raise _KeyError(
                    "kv_offload_gib",
                    self.kv_offload_gib,
                    f"the same size as service_env KV_OFFLOADING_SIZE={offload} (the /dev/shm check relies on it)",
                )
        tp = self.service_env.get("TP_SIZE")
        if tp is not None and tp != str(self.tensor_parallel_size):
            raise _KeyError(
                "service_env", f"TP_SIZE={tp}", f"TP_SIZE equal to tensor_parallel_size ({self.tensor_parallel_size})"
            )
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
            return f"{self.model_dir}/snapshots/{self.model_revision}"
        return self.model_root

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


COMPONENT_KEYS: dict[str, type[_Keys]] = {
    "cluster": ClusterKeys,
    "model": ModelKeys,
    "image": ImageKeys,
    "container": ContainerKeys,
    "host_tuning": HostTuningKeys,
    "nvidia_driver": NvidiaDriverKeys,
    "container_runtime": ContainerRuntimeKeys,
    "package_manager": PackageManagerKeys,
}


def defaults_of(keys: type[_Keys]) -> dict[str, Any]:
    """The documented defaults of one component (its deploy's ``DEFAULTS``); required keys are left out."""
    return {
        name: field.default
        for name, field in keys.model_fields.items()
        if name in keys.__annotations__ and not field.is_required()
    }


# --------------------------------------------------------------------------------------------------
# Errors that name host, key, value and expectation


class _KeyError(ValueError):
    """Raised inside validators so the message can name the key a cross-field rule is about."""

    def __init__(self, key: str, value: Any, expected: str):
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"{key}: {shown_value(key, value)}: expected {expected}")


# --------------------------------------------------------------------------------------------------
# Showing a bad value without ever showing a secret

# Keys whose value is a control-node path to a secret: a value that is not a path may be the secret itself.
SECRET_FILE_KEYS = ("model_hub_token_file", "registry_auth_file")
# Well-known token shapes (Hugging Face, GitHub, GitLab, OpenAI-style, AWS, Slack, JWT) and any long run of
# mixed-case letters and digits (a random secret) that is not plain hex (commits and digests are shown).
_TOKEN = re.compile(
    r"(hf_|gh[pousr]_|github_pat_|glpat-|sk-|xox[abprs]-)[A-Za-z0-9_-]{12,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r"|(?<![A-Za-z0-9+=])(?=[A-Za-z0-9+=]*[a-z])(?=[A-Za-z0-9+=]*[A-Z])(?=[A-Za-z0-9+=]*[0-9])[A-Za-z0-9+=]{32,}"
)
HIDDEN = "<hidden: looks like a secret>"


def looks_secret(text: str) -> bool:
    return bool(_TOKEN.search(text))


def shown_value(key: str, value: Any) -> str:
    """``value`` as an error message may show it: secrets (by the key's name, by their shape, or a
    secret-file key given something that is not a path) are replaced by a placeholder."""
    base = key.split("[", 1)[0]
    if base in SECRET_FILE_KEYS and value is not None and not (isinstance(value, str) and _PATH.fullmatch(value)):
        return "<hidden: not a path; the key takes a control-node file holding the secret>"
    if base not in SECRET_FILE_KEYS and SECRET_NAME.fullmatch(base):
        return "<hidden: the key is named like a secret>"
    return repr(_redacted(value))


class _Hidden(str):
    def __repr__(self) -> str:
        return HIDDEN


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return _Hidden() if looks_secret(value) else value
    if isinstance(value, dict):
        return {k: (_Hidden() if SECRET_NAME.fullmatch(str(k)) else _redacted(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redacted(v) for v in value)
    return value


@dataclass(frozen=True)
class Problem:
    host: str
    key: str
    value: Any
    expected: str
    gap: bool = False  # a value the profile's write-up leaves open (profile_gaps), not a wrong one

    def __str__(self) -> str:
        shown = "<missing>" if self.value is _MISSING else shown_value(self.key, self.value)
        return f"host {self.host}: key '{self.key}' = {shown}: expected {self.expected}"


_MISSING = object()


class InventoryValidationError(DeployError):
    """The inventory is invalid; nothing was changed on any host."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        hint = ""
        if any(p.gap for p in problems):
            hint = ("\n  (profile gaps: until they are set, deploy the other groups with pyinfra's --limit; a host "
                    "outside the limit whose only problems are gaps is left out)")
        super().__init__(
            f"inventory validation failed ({len(problems)} problem(s)); nothing was changed on any host:\n{lines}{hint}"
        )


# --------------------------------------------------------------------------------------------------
# pydantic's errors, as sentences that name the key


def _unprintable(text: str) -> bool:
    """Control, format (zero-width, bidi override) and line/paragraph separator characters: no unit file,
    env file, shell or terminal reads them back as written."""
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text)


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _expected_from(err: dict) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "string_pattern_mismatch":
        return f"a value matching {err['ctx']['pattern']}"
    for prefix in ("Input should be ", "String should have ", "String should be ", "List should have ",
                   "Dictionary should have ", "expected "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
            break
    if msg.startswith(("greater than", "less than")):
        msg = f"a number {msg}"
    elif msg.startswith(("at least", "at most")):
        msg = f"a value with {msg}"
    return msg.replace("a finite number", "a finite number (not inf or nan)")


def _union_field(key: str) -> bool:
    import types
    import typing

    field = NodeConfig.model_fields.get(key)
    return field is not None and typing.get_origin(field.annotation) in (typing.Union, types.UnionType)


def _problems_from(host: str, data: dict[str, Any], error: ValidationError) -> list[Problem]:
    out: list[Problem] = []
    union_expected: dict[str, list[str]] = {}
    for err in error.errors():
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, _KeyError):
            out.append(Problem(host, ctx_err.key, ctx_err.value, ctx_err.expected))
            continue
        loc = [str(p) for p in err["loc"]]
        key = loc[0] if loc else "?"
        if err["type"] == "missing":
            out.append(Problem(host, key, _MISSING, f"a value ({_describe(key)})"))
        elif err["type"] == "extra_forbidden" and len(loc) == 1:
            out.append(Problem(host, key, data.get(key), _unknown_key(key)))
        elif len(loc) >= 2 and _union_field(key) and not loc[1].isdigit():
            # one error per member of the union (loc names the member's type): one problem for the key
            union_expected.setdefault(key, []).append(_expected_from(err))
        else:
            where = key + "".join(f"[{p}]" for p in loc[1:])
            expected = "no such field: a typo?" if err["type"] == "extra_forbidden" else _expected_from(err)
            if err["type"] == "string_pattern_mismatch":
                expected += f" ({_describe(key)})"
            out.append(Problem(host, where, err.get("input"), expected))
    for key, alternatives in union_expected.items():
        out.append(Problem(host, key, data.get(key), " or ".join(dict.fromkeys(alternatives))))
    return out


def _unknown_key(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, [*NodeConfig.model_fields, *PYINFRA_KEYS], n=1, cutoff=0.75)
    hint = f"did you mean '{close[0]}'?" if close else "a typo?"
    return f"no such key ({hint} see the README's key table; pyinfra's own keys are its connectors' and global arguments')"


def _describe(key: str) -> str:
    field = NodeConfig.model_fields.get(key)
    return field.description if field and field.description else key


def schema_data(data: dict[str, Any]) -> dict[str, Any]:
    """The part of a host's data the schema owns (pyinfra's own connector/argument keys dropped)."""
    return {k: v for k, v in data.items() if k not in PYINFRA_KEYS}


def parse_node(host: str, data: dict[str, Any]) -> tuple[NodeConfig | None, list[Problem]]:
    cfg, problems = _parse_node(host, schema_data(data))
    return cfg, _as_gaps(host, data.get("profile_gaps"), problems)


def _as_gaps(host: str, gaps: Any, problems: list[Problem]) -> list[Problem]:
    """A key the profile lists in ``profile_gaps`` that is still unset is reported as the write-up's gap."""
    if not isinstance(gaps, dict):
        return problems
    return [
        Problem(host, p.key, _MISSING, f"a value: the profile's write-up stops here ({gaps[p.key]}) and the "
                "toolkit does not invent one; set it in the inventory to what you verified", gap=True)
        if p.key in gaps and isinstance(gaps[p.key], str) and (p.value is _MISSING or p.value is None) else p
        for p in problems
    ]


def _parse_node(host: str, data: dict[str, Any]) -> tuple[NodeConfig | None, list[Problem]]:
    unprintable = [Problem(host, key, value, "no control characters (newline, tab, NUL, escape, zero-width or "
                                             "bidi marks): unit and env files cannot carry them safely")
                   for key, value in data.items() if any(_unprintable(s) for s in _strings(value))]
    if unprintable:  # the other keys are still checked; these are reported once, never echoed raw elsewhere
        bad = {p.key for p in unprintable}
        rest = {k: v for k, v in data.items() if k not in bad}
        try:
            NodeConfig.model_validate(rest)
            return None, unprintable
        except ValidationError as e:
            others = [p for p in _problems_from(host, rest, e) if p.key.split("[", 1)[0] not in bad]
            return None, unprintable + others
    try:
        return NodeConfig.model_validate(data), []
    except ValidationError as e:
        return None, _problems_from(host, data, e)


def clusters(configs: dict[str, NodeConfig]) -> dict[str, list[tuple[str, NodeConfig]]]:
    """Hosts by `cluster_name`, in inventory order: (host name, config) pairs."""
    out: dict[str, list[tuple[str, NodeConfig]]] = defaultdict(list)
    for name, cfg in configs.items():
        out[cfg.cluster_name].append((name, cfg))
    return dict(out)


def cluster_head(members: list[tuple[str, NodeConfig]]) -> NodeConfig | None:
    return next((cfg for _, cfg in members if cfg.node_rank == 0), None)


def cluster_problems(configs: dict[str, NodeConfig]) -> list[Problem]:
    """Rules across the nodes of a cluster: size, ranks, one head, fabric addresses."""
    problems: list[Problem] = []
    for cluster, members in clusters(configs).items():
        n = len(members)
        for name, cfg in members:
            expected_tp = len(cfg.gpu_indices) * n
            if cfg.tensor_parallel_size != expected_tp:
                problems.append(Problem(
                    name, "tensor_parallel_size", cfg.tensor_parallel_size,
                    f"{expected_tp} = {len(cfg.gpu_indices)} GPU(s) per node × {n} node(s) in cluster {cluster}",
                ))
            if cfg.node_rank >= n:
                problems.append(Problem(name, "node_rank", cfg.node_rank, f"a rank in 0..{n - 1} (cluster {cluster} has {n} node(s))"))
            if n > 1 and cfg.fabric_address is None:
                problems.append(Problem(name, "fabric_address", None, f"an address, since cluster {cluster} spans {n} nodes"))
        by_rank: dict[int, list[str]] = defaultdict(list)
        for name, cfg in members:
            by_rank[cfg.node_rank].append(name)
        for rank, names in sorted(by_rank.items()):
            if len(names) > 1:
                for name in names:
                    problems.append(Problem(name, "node_rank", rank, f"a rank unique in cluster {cluster} (also on {', '.join(x for x in names if x != name)})"))
        if 0 not in by_rank:
            for name, cfg in members:
                problems.append(Problem(name, "node_rank", cfg.node_rank, f"exactly one head (rank 0) in cluster {cluster}; none has rank 0"))
        addresses: dict[str, list[str]] = defaultdict(list)
        for name, cfg in members:
            if cfg.fabric_address:
                addresses[cfg.fabric_address].append(name)
        for addr, names in addresses.items():
            if len(names) > 1:
                for name in names:
                    problems.append(Problem(name, "fabric_address", addr, f"an address unique in cluster {cluster}"))
        for key in ("model_repo", "model_revision", "model_manifest", "image", "image_digest", "tensor_parallel_size",
                    "vllm_launch", "vllm_command", "vllm_args", "vllm_speculative_config", "served_model_name", "vllm_master_port",
                    "container_exec", "service_env", "model_mount", "model_layout", "gpu_indices"):
            values = {repr(getattr(cfg, key)) for _, cfg in members}
            if len(values) > 1:
                for name, cfg in members:
                    problems.append(Problem(name, key, getattr(cfg, key), f"the same value on every node of cluster {cluster}"))
    return problems


def validate_hosts(hosts: dict[str, dict[str, Any]], deployed: set[str] | None = None) -> dict[str, NodeConfig]:
    """Validate every host's data and the cluster rules; raise one error listing every problem.

    ``deployed`` (pyinfra's --limit, widened to whole clusters): a host outside it whose only problems are
    profile gaps is left out of the result instead of refusing the run, so deploying A and B need not wait
    for the values C's write-up leaves open. Any other problem on any host still refuses the run.
    """
    configs: dict[str, NodeConfig] = {}
    problems: list[Problem] = []
    for name, data in hosts.items():
        cfg, errs = parse_node(name, data)
        if deployed is not None and name not in deployed and errs and all(p.gap for p in errs):
            continue
        problems += errs
        if cfg is not None:
            configs[name] = cfg
    problems += machine_problems(hosts)
    if not problems:
        problems = cluster_problems(configs)
    if problems:
        raise InventoryValidationError(problems)
    return configs


def machine_problems(hosts: dict[str, dict[str, Any]]) -> list[Problem]:
    """One machine (SSH address and port) under two inventory names would get two services on one port."""
    by_machine: dict[tuple[str, int], list[str]] = defaultdict(list)
    for name, data in hosts.items():
        if name.startswith("@"):
            continue
        address = str(data.get("ssh_hostname") or name).lower().rstrip(".")
        by_machine[(address, int(data.get("ssh_port") or 22))].append(name)
    return [
        Problem(name, "ssh_hostname", address,
                f"one inventory name per machine ({address}:{port} is also {', '.join(n for n in names if n != name)})")
        for (address, port), names in by_machine.items() if len(names) > 1 for name in names
    ]


def group_problems(inventory) -> list[Problem]:
    """A host in two groups that set one key differently gets whichever pyinfra merges last: name it.
    Groups holding every host (`all`, the inventory file's own group, applied last) are layers, not rivals
    (so in a one-host inventory no group is compared)."""
    problems = [
        Problem(name, "(inventory entry)", name, f"one entry per host: it is listed more than once in group "
                f"{' and '.join(groups)} (pyinfra merges the entries silently; the later one's values win)")
        for name, groups in getattr(inventory, "listed_twice", {}).items()
    ]
    everyone = set(inventory)
    for host in inventory:
        own = inventory.get_host_data(host.name) or {}
        groups = [g for g, members in inventory.groups.items() if host in members and set(members) != everyone]
        seen: dict[str, tuple[str, Any]] = {}
        for group in groups:
            for key, value in (inventory.get_group_data(group) or {}).items():
                if key in own or key.startswith("__"):
                    continue
                if key in seen and seen[key][1] != value:
                    problems.append(Problem(
                        host.name, key, value,
                        f"one value: the host is in groups {seen[key][0]} and {group}, which set it differently "
                        "(set it on the host, or in one of the groups)"))
                seen.setdefault(key, (group, value))
    return problems


def validate_inventory(inventory, limit_hosts=None) -> dict[str, NodeConfig]:
    """Validate every host of a pyinfra inventory (all of them, not only those --limit selects; see
    validate_hosts for the one exception, profile gaps outside the limit)."""
    problems = group_problems(inventory)
    hosts = {h.name: h.data.dict() for h in inventory}
    deployed = None
    if limit_hosts is not None:
        limited = {h.name for h in limit_hosts}
        cluster_of = {name: data.get("cluster_name") for name, data in hosts.items()}
        deployed = {name for name in hosts
                    if name in limited or cluster_of[name] in {cluster_of[x] for x in limited if x in cluster_of}}
    try:
        configs = validate_hosts(hosts, deployed)
    except InventoryValidationError as e:
        problems += e.problems
    if problems:
        raise InventoryValidationError(problems)
    return configs


# --------------------------------------------------------------------------------------------------
# The README key table


def markdown_table() -> str:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for component, keys in COMPONENT_KEYS.items():
        for name, field in keys.model_fields.items():
            if name not in keys.__annotations__:
                continue
            default = "*required*" if field.is_required() else f"`{_fmt_default(field.default)}`"
            desc = (field.description or "").replace("|", "\\|")
            lines.append(f"| `{name}` ({component}) | {default} | {desc} |")
    return "\n".join(lines)


def _fmt_default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


README_START = "<!-- inventory-keys:start (generated by `make readme-keys`) -->"
README_END = "<!-- inventory-keys:end -->"


def readme_with_table(readme: str) -> str:
    """``readme`` with the key table between its markers replaced by the schema's current one."""
    head, rest = readme.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_START}\n{markdown_table()}\n{README_END}{tail}"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--update-readme"]:
        path = sys.argv[2]
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(readme_with_table(text))
    else:
        print(markdown_table())
