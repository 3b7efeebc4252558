"""Keys of how the container is run and what vLLM is told (Quadlet `[Container]`,
deploys/service/unit.py)."""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from typing import Any, Literal

from pydantic import model_validator

from deploys.schema.base import (HEX40, SYSTEM_DIRS, ComponentKeys, ContainerPath, DevicePath, EnvMap, IpAddress, OwnedDir,
                                 ReadOnlyRoot, _key)
from deploys.schema.base import KeyRuleError
from deploys.schema.secret_shapes import URL_CREDENTIALS, looks_secret
from deploys.unit_text import LONE_SEMICOLON
from files.model_snapshot.snapshot_manifest import inside  # one definition of "at or below"


# The service is `<container_name>.service`: it must not be a unit the node or this toolkit already has.
RESERVED_UNIT_NAMES = frozenset({
    "nvidia-cdi-refresh", "nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "podman",
    "podman-auto-update", "podman-restart", "podman-clean-transient", "ssh", "sshd", "dbus", "cron", "rsync",
    "docker", "containerd", "unattended-upgrades", "apt-daily", "apt-daily-upgrade", "networking", "network",
    "getty", "init", "user", "default", "multi-user", "emergency", "rescue", "reboot", "shutdown",
})
RESERVED_UNIT_PREFIXES = ("systemd-", "inference-nodes", "nvidia-", "podman-", "apt-", "dpkg", "user-")

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
    "--host": "api_bind_address", "--port": "engine_port",
}


ENGINE_PORT_OFFSET = 10000  # engine_port's default distance from api_port

SECRET_VLLM_FLAGS = frozenset({"--api-key", "--api_key", "--hf-token", "--hf_token"})


def vllm_flag_name(arg: str) -> str | None:
    """The flag ``arg`` spells, as vLLM's parser reads it (`--x_y` is `--x-y`, `--x=v` is `--x`), else None."""
    if not arg.startswith("-"):
        return None
    name = arg.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def derived_vllm_flag(arg: str) -> str | None:
    """The derived flag ``arg`` spells, else None."""
    name = vllm_flag_name(arg)
    return name if name in DERIVED_VLLM_FLAGS else None


class ContainerKeys(ComponentKeys):
    """How the container is run (Quadlet `[Container]`)."""

    container_name: str = _key(
        "inference", description="container and systemd service name (not a system or toolkit unit's name)",
        pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$",
    )
    container_exec: str | None = _key(None, description="command the container runs (Quadlet `Exec=`); unset = image default")
    container_privileged: bool = _key(False, description="run `--privileged` (deployment A did; least privilege otherwise)")
    vllm_args_check_network: Literal["none", "host"] = _key(
        "none", description="network of the throwaway container that parses a new vLLM command line with the image's "
        "own vLLM (no capabilities, no new privileges; it opens no socket): `host` only where a container cannot "
        "have a network namespace of its own (a nested container, as the sandbox's nodes are)",
    )
    container_ipc_host: bool = _key(False, description="share the host's IPC namespace (`--ipc=host`); excludes `container_shm_size`")
    container_shm_size: str | None = _key(
        None, description="container /dev/shm size (`ShmSize=`, e.g. `16g`); unset without `container_ipc_host`: "
        "`kv_offload_gib + shm_headroom_gib` (never Podman's 64 MiB default); Podman refuses it with `--ipc=host`",
        pattern=r"^[0-9]+[bkmg]?$",
    )
    container_devices: list[DevicePath] = _key(
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
    model_mount: ContainerPath = _key("/models", description="where the model directory is mounted read-only in the container")
    jit_cache_dir: OwnedDir | None = _key(None, description="host directory for the persistent JIT cache")
    jit_cache_mount: ContainerPath = _key("/cache", description="mount point of `jit_cache_dir` in the container")
    container_tmp_dir: OwnedDir | None = _key(None, description="host directory for the container's persistent tmp")
    container_tmp_mount: ContainerPath = _key("/container-tmp", description="mount point of `container_tmp_dir` in the container")
    api_bind_address: IpAddress = _key("127.0.0.1", description="address the API listens on; loopback unless fronted by an authenticating proxy")
    api_port: int = _key(8000, description="where clients on the head reach the API: the head's door (plain HTTP, "
                         "a JSON 503 while the service switches releases) in front of vLLM on engine_port", ge=1, le=65535)
    engine_port: int | None = _key(
        None, description="where vLLM itself listens, on loopback behind the head's door (the serving gate, the drain "
        "and the metrics ask it there); default api_port + 10000 (api_port - 10000 above 55535)", ge=1, le=65535)

    @model_validator(mode="before")
    @classmethod
    def _engine_port_beside_the_api(cls, data):
        """engine_port's default, from api_port as given (a value api_port refuses is reported under api_port)."""
        if isinstance(data, dict) and data.get("engine_port") is None:
            try:
                api = int(data.get("api_port", 8000))
            except (TypeError, ValueError):
                return data
            return {**data, "engine_port": api + ENGINE_PORT_OFFSET if api + ENGINE_PORT_OFFSET <= 65535
                    else api - ENGINE_PORT_OFFSET}
        return data

    @property
    def engine_address(self) -> str:
        """vLLM's own address: loopback behind the door (api_bind_address where that is loopback). A release from
        before the door (its record has no engine port: engine_port is its api_port) listened where clients were."""
        if self.engine_port == self.api_port or ipaddress.ip_address(self.api_bind_address).is_loopback:
            return self.api_bind_address
        return "::1" if ipaddress.ip_address(self.api_bind_address).version == 6 else "127.0.0.1"

    @property
    def has_door(self) -> bool:
        """Whether clients' API port is a door of its own (nginx) in front of vLLM: every head the inventory
        describes; not a release from before the door, which serves on the clients' port itself."""
        return self.engine_port != self.api_port
    api_protected_by: str | None = _key(
        None, description="how a non-loopback API is protected (required when `api_bind_address` is not loopback)"
    )
    roce_sysfs_root: ReadOnlyRoot = _key(
        "/sys", description="sysfs the RoCE GID lookup reads at service start (`/sys`; the sandbox has a stand-in tree)"
    )
    service_timeout_start_sec: int = _key(3600, description="`TimeoutStartSec=`: first start compiles and loads ~160 GB", ge=1, le=7 * 86400)
    service_ready_timeout_sec: int = _key(
        1800, description="how long a converge, and the audit's serving checks, wait for a (re)started service to "
        "answer `/health` before the host fails: a first start loads the weights and compiles (seed 000: 47.5 s "
        "init + 12.6 s compile from warm disks; ~160 GB from cold NVMe takes minutes); a unit that fails or "
        "restarts meanwhile fails at once", ge=30, le=7 * 86400,
    )
    failed_release_policy: Literal["rollback", "stop", "keep"] = _key(
        "rollback", description="when a (re)started head fails to serve or fails the serving gate: `rollback` puts back "
        "its last good release (unit, environment, model manifest and stamp; its image and model commit are kept on "
        "the node), restarts it, workers first, and gates it again; `stop` stops the service; `keep` leaves it as it "
        "is. The host fails in every case, saying which",
    )
    retry_failed_release: bool = _key(
        False, description="switch to the release the inventory asks for even though it failed on this cluster "
        "before (a failed release is remembered on every member, and a converge refuses to switch to it again: "
        "`--data retry_failed_release=true` once, after fixing what failed outside the inventory)",
    )
    releases_kept: int = _key(
        2, description="how many of the newest releases that passed the serving gate keep their model commit and "
        "image on the node (the one serving among them); older commits (`hf_cache`: their snapshots, and blobs no "
        "kept snapshot links to) and images are pruned after a gate passes", ge=1, le=20,
    )
    service_timeout_stop_sec: int = _key(120, description="`TimeoutStopSec=`", ge=1, le=86400)
    service_restart_sec: int = _key(30, description="`RestartSec=`: the first delay before the service restarts "
                                    "after any exit (it grows to 300 s over 5 restarts, and goes back to this once "
                                    "the service has been healthy for `service_backoff_reset_after_s`); at least 1: "
                                    "0 would turn the growth off and let a failing start hammer the node", ge=1, le=86400)
    service_backoff_reset_after_s: int = _key(
        600, description="seconds a service must run, with no automatic restart, before a timer on the node resets "
        "its restart delay to `service_restart_sec` (systemd never does it by itself)", ge=30, le=86400,
    )
    service_switch_lease_s: int = _key(
        300, description="how long a converge's switch marker counts (the service-down and closed-endpoint alerts stay "
        "quiet: planned work) unless the converge renews it, which it does every third of it while it waits for the "
        "service; a converge killed mid-switch stops muting them this long after its last renewal", ge=60, le=3600,
    )
    service_worker_grace_sec: int = _key(
        120, description="multi-node workers: seconds after start before a head that does not answer on "
        "`vllm_master_port` gets the worker killed and restarted (`HealthStartPeriod=`)", ge=10, le=86400,
    )

    def vllm_flag(self, flag: str) -> str | None:
        """The value ``vllm_args`` gives ``flag`` (in any spelling vLLM reads: `--flag V`, `--flag=V`, `--fl_ag V`;
        the last one wins), else None."""
        value = None
        for i, arg in enumerate(self.vllm_args):
            if vllm_flag_name(arg) != flag:
                continue
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(self.vllm_args):
                value = self.vllm_args[i + 1]
        return value

    @model_validator(mode="after")
    def _launch_rules(self) -> ContainerKeys:
        try:
            exec_words = shlex.split(self.container_exec or "")
        except ValueError as e:  # no closing quotation, a trailing escape
            raise KeyRuleError("container_exec", self.container_exec,
                               f"a command line shlex can split ({e}: balance the quotes)") from None
        for key, words in (("vllm_command", self.vllm_command), ("vllm_args", self.vllm_args),
                           ("container_exec", exec_words)):
            if "" in words:
                raise KeyRuleError(key, words, "no empty arguments: Podman's Quadlet drops an empty word of Exec= "
                                   "and every argument after it")
            if LONE_SEMICOLON in words:
                raise KeyRuleError(key, words, "no argument that is exactly ';': Podman 4.9.3's Quadlet writes it "
                                   "back bare, and systemd reads a bare ';' as a command separator")
            for word in words:
                if looks_secret(word) or URL_CREDENTIALS.search(word):
                    raise KeyRuleError(key, word, "no secrets on the command line (it is in the unit file and in "
                                       "`ps`, readable by every user): give secrets as files (model_hub_token_file, "
                                       "registry_auth_file)")
        if self.vllm_launch == "image_env":
            if not self.container_exec:
                raise KeyRuleError("container_exec", None, "the image's serving script, since vllm_launch is image_env")
            if self.vllm_speculative_config is not None:
                raise KeyRuleError("vllm_speculative_config", self.vllm_speculative_config,
                                   "unset with vllm_launch image_env (the image's script sets speculative decoding "
                                   "from service_env)")
            if self.vllm_args:
                raise KeyRuleError("vllm_args", self.vllm_args,
                                   "no flags with vllm_launch image_env (the image's script builds vLLM's arguments "
                                   "from service_env)")
            derived = {"SERVED_MODEL_NAME": self.served_model_name, "PORT": str(self.engine_port)}
            for name, want in derived.items():
                have = self.service_env.get(name)
                if have is not None and want is not None and have != want:
                    key = "served_model_name" if name == "SERVED_MODEL_NAME" else "engine_port"
                    raise KeyRuleError("service_env", f"{name}={have}", f"{name} equal to {key} ({want})")
        else:
            if self.container_exec:
                raise KeyRuleError("container_exec", self.container_exec,
                                   "unset with vllm_launch cli (the command is vllm_command + derived flags + vllm_args)")
            for arg in self.vllm_args:
                if arg.split("=", 1)[0] in SECRET_VLLM_FLAGS or looks_secret(arg):
                    raise KeyRuleError("vllm_args", arg, "no secrets on the command line (it is in the unit file and "
                                       "in `ps`): the API stays on loopback behind an authenticating proxy; hub "
                                       "tokens go in model_hub_token_file")
                flag = derived_vllm_flag(arg)
                if flag:
                    raise KeyRuleError("vllm_args", arg,
                                       f"no {flag}: the toolkit derives it ({DERIVED_VLLM_FLAGS[flag]})")
        return self

    @model_validator(mode="after")
    def _speculative_config(self) -> ContainerKeys:
        spec = self.vllm_speculative_config
        if spec is None:
            return self
        if not isinstance(spec.get("method"), str) or not re.fullmatch(r"[a-z0-9_]+", spec["method"]):
            raise KeyRuleError("vllm_speculative_config", spec, "a `method` (e.g. mtp, eagle3, draft_model)")
        tokens = spec.get("num_speculative_tokens")
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or not 1 <= tokens <= 64):
            raise KeyRuleError("vllm_speculative_config", spec, "num_speculative_tokens a whole number from 1 to 64")
        if "model" in spec and not (isinstance(spec.get("revision"), str) and HEX40.fullmatch(spec["revision"])):
            raise KeyRuleError("vllm_speculative_config", spec,
                               "a 40-hex `revision` beside the external draft `model`: a re-uploaded drafter changes "
                               "what is served (seed 003)")
        try:
            json.dumps(spec, allow_nan=False)
        except (TypeError, ValueError):
            raise KeyRuleError("vllm_speculative_config", spec, "plain JSON values (strings, numbers, booleans, "
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
            if mount in SYSTEM_DIRS or any(inside(mount, d) for d in ("/proc", "/sys", "/dev")):
                raise KeyRuleError(key, mount, "a mount point of its own, not / or a system directory of the image")
        for i, (key, mount) in enumerate(mounts):
            for other_key, other in mounts[:i]:
                if inside(mount, other) or inside(other, mount):
                    raise KeyRuleError(key, mount, f"a mount point apart from {other_key} ({other}): neither may "
                                       "contain the other")
        return self

    @model_validator(mode="after")
    def _container_rules(self) -> ContainerKeys:
        if self.container_name in RESERVED_UNIT_NAMES or self.container_name.startswith(RESERVED_UNIT_PREFIXES):
            raise KeyRuleError("container_name", self.container_name,
                               "a name of its own: the service would replace or shadow a system or toolkit unit")
        if self.container_ipc_host and self.container_shm_size is not None:
            raise KeyRuleError(
                "container_shm_size",
                self.container_shm_size,
                "unset while container_ipc_host is true (Podman refuses --ipc=host with a shm size)",
            )
        if not self.has_door:
            raise KeyRuleError("engine_port", self.engine_port,
                               "a port other than api_port (the head's door listens there, in front of vLLM)")
        if not ipaddress.ip_address(self.api_bind_address).is_loopback and not (self.api_protected_by or "").strip():
            raise KeyRuleError(
                "api_protected_by",
                self.api_protected_by,
                f"a description of the authenticating proxy, since api_bind_address is {self.api_bind_address} "
                "(not loopback)",
            )
        return self
