"""Facts about a node: OS, CPU, memory, free disk, mount sizes, RDMA devices, Podman version."""

from __future__ import annotations

import json
import shlex
from typing import NotRequired, TypedDict

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from files.model_snapshot.snapshot_manifest import KEPT_TREES


# Shared by two facts: move $p up to its nearest existing parent (the model path may not exist yet), and
# the bytes available there.
_NEAREST = 'while [ ! -e "$p" ]; do p=$(dirname "$p"); done'
_AVAIL = 'df -P -B1 "$p" | awk \'NR==2 {print $4}\''

# One round trip: every value preflight needs, as key=value lines. A missing path (model not there yet)
# is not an error: free space is read at the nearest existing parent, present bytes are 0.
_NODE_RESOURCES = r"""
. /etc/os-release 2>/dev/null
echo "os=${PRETTY_NAME:-unknown}"
if [ -r /etc/dgx-release ]; then
  v=$(sed -n 's/^DGX_OTA_VERSION="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/dgx-release | tail -n1)
  [ -n "$v" ] || v=$(sed -n 's/^DGX_SWBUILD_VERSION="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/dgx-release | tail -n1)
  echo "dgx_os=${v:-unknown}"
fi
echo "arch=$(uname -m)"
echo "kernel=$(uname -r)"
echo "cpus=$(getconf _NPROCESSORS_ONLN)"
echo "mem_bytes=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) * 1024 ))"
p={model_root}
{nearest}
echo "disk_path=$p"
echo "disk_free_bytes=$({avail})"
held=$(sed -n 's/.*"commit": "\([0-9a-f]*\)".*/\1/p' {stamp} 2>/dev/null)
if [ -n "$held" ] && [ "$held" != {revision} ]; then
  echo "model_held_commit=$held"; echo "model_present_bytes=0"
elif [ -e {snapshot_dir} ]; then
  echo "model_present_bytes=$(du -sbL --exclude={kept_trees} {snapshot_dir} 2>/dev/null | cut -f1)"
else echo "model_present_bytes=0"; fi
echo "rdma=$(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
"""

_INT_KEYS = ("cpus", "mem_bytes", "disk_free_bytes", "model_present_bytes")


class NodeResourcesDict(TypedDict):
    os: NotRequired[str]  # PRETTY_NAME of /etc/os-release ("unknown" without one)
    dgx_os: str | None  # DGX OS version from /etc/dgx-release; None: not DGX OS
    arch: str  # uname -m
    kernel: NotRequired[str]  # uname -r
    cpus: int
    mem_bytes: int
    disk_path: NotRequired[str]  # the model path, or its nearest existing parent: where free space is read
    disk_free_bytes: int
    model_present_bytes: int  # bytes of the asked commit already there (0: none, or the directory holds another)
    model_held_commit: NotRequired[str]  # the verified commit a directory shared by every commit holds, when not the asked one
    rdma: list[str]  # /sys/class/infiniband devices


class NodeResources(FactBase[NodeResourcesDict]):
    """OS (and the DGX OS version from /etc/dgx-release, where present), arch, kernel, CPUs, RAM, free disk at
    the model path, RDMA devices. (Podman's version is the PodmanVersion fact, which the container runtime
    reads too: one `podman --version` per run.)

    .. code:: python

        {"os": "Ubuntu 24.04.3 LTS", "arch": "x86_64", "kernel": "6.8.0-87-generic", "cpus": 32,
         "mem_bytes": 811748065280, "disk_path": "/mnt/data", "disk_free_bytes": 3298534883328,
         "model_present_bytes": 0, "rdma": ["mlx5_0"]}
    """

    default = dict

    def command(self, model_root: str, snapshot_dir: str, revision: str = "", stamp: str = "/dev/null") -> str:
        """``stamp``: the verify stamp, where ``snapshot_dir`` is one directory for every commit (the `plain` layout):
        when it vouches for another commit than ``revision``, none of the asked commit counts as present (the sync
        writes every file beside the held one, which is kept for a rollback)."""
        return (_NODE_RESOURCES.replace("{nearest}", _NEAREST).replace("{avail}", _AVAIL)
                .replace("{model_root}", shlex.quote(model_root))
                .replace("{snapshot_dir}", shlex.quote(snapshot_dir))
                .replace("{revision}", shlex.quote(revision)).replace("{stamp}", shlex.quote(stamp))
                .replace("{kept_trees}", shlex.quote(KEPT_TREES)))

    def process(self, output: list[str]) -> NodeResourcesDict:
        values: dict = {}
        for line in output:
            if "=" in line:
                key, value = line.split("=", 1)
                values[key.strip()] = value.strip()
        missing = [k for k in ("arch", *_INT_KEYS) if k not in values]
        if missing:
            raise FactProcessError(f"NodeResources: no value for {', '.join(missing)} in {output!r}")
        try:
            for key in _INT_KEYS:
                values[key] = int(values[key] or 0)
        except ValueError as e:
            raise FactProcessError(f"NodeResources: {e}") from e
        values["rdma"] = values.get("rdma", "").split()
        values["dgx_os"] = values.get("dgx_os") or None
        return values


def _df_bytes(fact: FactBase, output: list[str]) -> int:
    try:
        return int(output[0])
    except (IndexError, ValueError) as e:
        raise FactProcessError(f"{type(fact).__name__}: unexpected df output {output!r}") from e


class MountSizeBytes(FactBase[int]):
    """Size in bytes of the filesystem mounted at ``path`` (``/dev/shm``: the tmpfs limit), 0 if absent."""

    default = int

    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return f"if [ -d {q} ]; then df -P -B1 {q} | awk 'NR==2 {{print $2}}'; else echo 0; fi"

    def process(self, output: list[str]) -> int:
        return _df_bytes(self, output)


class FreeBytes(FactBase[int]):
    """Bytes available at ``path`` (or at its nearest existing parent)."""

    default = int

    def command(self, path: str) -> str:
        return f"p={shlex.quote(path)}; {_NEAREST}; {_AVAIL}"

    def process(self, output: list[str]) -> int:
        return _df_bytes(self, output)




class ManagedFileDict(TypedDict):
    user: str
    group: str
    mode: int  # as pyinfra's File fact gives it: 644
    sha1: str


class ManagedFiles(FactBase[dict[str, ManagedFileDict | None]]):
    """Owner, group, mode and sha1 of several managed files in one round trip: ``{path: {"user", "group",
    "mode", "sha1"} or None}`` (None: not a regular file; mode as pyinfra's File fact gives it, e.g. 644).
    One ``stat`` and one ``sha1sum`` for all regular files, not one of each per file: a no-op converge reads
    some thirty managed files per node. Paths are the toolkit's own (no newline in them)."""

    def command(self, paths: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (f"set --; for p in {quoted}; do if [ -f \"$p\" ]; then set -- \"$@\" \"$p\"; "
                f"else printf '%s\\t-\\n' \"$p\"; fi; done; "
                f"if [ $# -gt 0 ]; then stat --printf '%n\\t%U %G %a\\n' -- \"$@\" && sha1sum -- \"$@\"; fi")

    def process(self, output: list[str]) -> dict[str, ManagedFileDict | None]:
        files: dict[str, ManagedFileDict | None] = {}
        owners: dict[str, tuple[str, str, int]] = {}
        sums: dict[str, str] = {}
        for line in output:
            path, tab, state = line.partition("\t")
            try:
                if not tab:  # sha1sum: "<40 hex>  <path>"
                    digest, path = line.split("  ", 1)
                    sums[path] = digest
                elif state.strip() == "-":
                    files[path] = None
                else:
                    user, group, mode = state.split()
                    owners[path] = (user, group, int(mode))
            except ValueError as e:
                raise FactProcessError(f"ManagedFiles: unexpected line {line!r}") from e
        for path, (user, group, mode) in owners.items():
            if path not in sums:
                raise FactProcessError(f"ManagedFiles: no sha1 for {path!r}")
            files[path] = {"user": user, "group": group, "mode": mode, "sha1": sums[path]}
        return files


class FilesMatching(FactBase[list]):
    """The files in ``directory`` whose names match any of the shell ``patterns`` (``scrape-*.key``), sorted; empty
    where the directory does not exist. Names are the toolkit's own (no newline in them)."""

    default = list

    def command(self, directory: str, patterns: tuple[str, ...]) -> str:
        globs = " ".join(f"{shlex.quote(directory)}/{p}" for p in patterns)  # the patterns themselves: the toolkit's
        return f"for f in {globs}; do if [ -f \"$f\" ]; then printf '%s\\n' \"$f\"; fi; done; true"

    def process(self, output: list[str]) -> list:
        return sorted(line for line in output if line)


class InterfaceAddresses(FactBase[list]):
    """Every address assigned to the node's interfaces with its prefix (`ip -o addr`), e.g.
    ``["127.0.0.1/8", "192.0.2.10/24", "fe80::1/64"]``; empty where iproute2 is missing."""

    default = list

    def command(self) -> str:
        return "command -v ip >/dev/null && ip -o addr show | awk '{print $4}' || true"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if "/" in line]


class ExistingPaths(FactBase[list]):
    """Which of ``paths`` exist on the node (devices, directories, files)."""

    default = list

    def command(self, paths: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return f"for p in {quoted}; do [ -e \"$p\" ] && echo \"$p\"; done; true" if paths else "true"

    def process(self, output: list[str]) -> list[str]:
        return [line for line in output if line]


class SystemdDefaultLimits(FactBase[dict]):
    """The default limits systemd's manager gives services now (`systemctl show -p DefaultLimitMEMLOCK ...`), as
    systemd writes them (bytes, or `infinity`): ``{"DefaultLimitNOFILE": "1048576", ...}``; {} where systemd
    does not run as init."""

    default = dict

    def command(self, names: tuple[str, ...]) -> str:
        return f"systemctl show {' '.join(f'-p {shlex.quote(n)}' for n in names)} 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, str]:
        return dict(line.strip().split("=", 1) for line in output if "=" in line)


class SystemdNeedsReload(FactBase[bool]):
    """Whether any of ``units`` changed on disk since systemd loaded it (its own NeedDaemonReload)."""

    default = bool

    def command(self, units: tuple[str, ...]) -> str:
        return f"systemctl show -p NeedDaemonReload --value {' '.join(shlex.quote(u) for u in units)}"

    def process(self, output: list[str]) -> bool:
        return "yes" in " ".join(output).split()


class PrometheusReload(FactBase[str]):
    """What the running Prometheus on 127.0.0.1:``port`` says of its last (re)load (``helper``: files/monitoring/
    prometheus_loaded.py, installed by the monitoring host's deploy): ``loaded``, ``not-loaded`` (the last reload
    failed: it runs older rules than its files), or ``down`` (no answer, or the helper not installed yet)."""

    def command(self, helper: str, port: int) -> str:
        return f"python3 {shlex.quote(helper)} {int(port)} 2>/dev/null || echo down"

    def process(self, output: list[str]) -> str:
        said = output[-1].strip() if output else ""
        return said if said in ("loaded", "not-loaded") else "down"


class FiringAlerts(FactBase[list]):
    """The labels of every alert firing on the Prometheus at 127.0.0.1:``port`` of the monitoring host, the Watchdog
    left out (it always fires); None when Prometheus does not answer (deploys/rollout/: a wave's bake)."""

    def command(self, port: int) -> str:
        code = ("import json,urllib.request\ntry:\n r=json.load(urllib.request.urlopen("
                f"'http://127.0.0.1:{int(port)}/api/v1/alerts',timeout=10))\n"
                " print(json.dumps([a['labels'] for a in r['data']['alerts'] if a.get('state')=='firing'"
                " and a['labels'].get('alertname')!='Watchdog']))\nexcept Exception:\n print('null')")
        return f"python3 -c {shlex.quote(code)}"

    def process(self, output: list[str]) -> list | None:
        try:
            alerts = json.loads("\n".join(output))
        except ValueError:
            return None
        return alerts if isinstance(alerts, list) else None
