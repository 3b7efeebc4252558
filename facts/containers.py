"""Facts about the container runtime: Podman's version, the CDI spec (parsed with pyyaml), images."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, TypedDict

import yaml
from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

_MARK = "##inference-nodes:"


def podman_version(output: str) -> str | None:
    """The version in `podman --version`'s output (`podman version 4.9.3` -> `4.9.3`), None when there is
    none: the one parser of it (PodmanVersion, and facts/host.py NodeResources for the preflight table)."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", output)
    return m.group(1) if m else None


class PodmanVersion(FactBase[str]):
    """Podman's version (`4.9.3`), or None when Podman is not installed."""

    @staticmethod
    def default():
        return None

    def requires_command(self) -> str:
        return "podman"

    def command(self) -> str:
        return "podman --version"

    def process(self, output: list[str]) -> str:
        version = podman_version(" ".join(output))
        if version is None:
            raise FactProcessError(f"PodmanVersion: unexpected output {output!r}")
        return version


def parse_cdi_spec(text: str) -> dict[str, Any]:
    """The parts of a CDI spec we check: kind, cdiVersion, device names, whether any edit carries
    `additionalGids` (CDI 0.7.0, which Podman < 5.1 cannot read), and the driver version its library
    mounts name (`libcuda.so.580.95.05`), so a spec older than the driver is recognisable."""
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"not YAML: {e}") from None
    if not isinstance(spec, dict) or "kind" not in spec or not isinstance(spec.get("devices"), list):
        raise ValueError("not a CDI spec (no kind/devices)")
    edits = [spec.get("containerEdits") or {}] + [(d or {}).get("containerEdits") or {} for d in spec["devices"]]
    gids = any("additionalGids" in (e or {}) for e in edits)
    for e in edits:
        for node in e.get("deviceNodes") or []:
            gids = gids or "additionalGids" in (node or {})
    driver = None
    for e in edits:
        for mount in e.get("mounts") or []:
            m = re.search(r"libcuda\.so\.(\d{3}\.\d+(?:\.\d+)?)$", str((mount or {}).get("hostPath", "")))
            if m:
                driver = m.group(1)
    return {
        "kind": spec["kind"],
        "cdi_version": str(spec.get("cdiVersion", "")),
        "devices": [str(d.get("name")) for d in spec["devices"] if isinstance(d, dict)],
        "additional_gids": gids,
        "driver_version": driver,
    }


class CdiSpec(FactBase[dict]):
    """A CDI spec file, parsed: ``{"present": False}`` when absent; FactProcessError when unreadable."""

    default = dict

    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return f"if [ -f {q} ]; then echo '{_MARK}present'; cat {q}; else echo '{_MARK}absent'; fi"

    def process(self, output: list[str]) -> dict[str, Any]:
        if not output or output[0].strip() == f"{_MARK}absent":
            return {"present": False}
        try:
            return {"present": True, **parse_cdi_spec("\n".join(output[1:]))}
        except ValueError as e:
            raise FactProcessError(f"CdiSpec: {e}") from e


class PodmanImageDigests(FactBase[list]):
    """Every digest a local image reference (`name@sha256:…` or `name:tag`) answers to: the image's own manifest
    digest first, then those of its repo digests (a multi-arch image pulled by its index digest keeps the
    per-platform manifest's digest as ``.Digest`` and the index digest only among ``.RepoDigests``,
    containers/podman#24858). Empty when absent."""

    default = list

    def requires_command(self, ref: str) -> str:
        return "podman"

    def command(self, ref: str) -> str:
        q = shlex.quote(ref)
        return (f"podman image inspect --format '{{{{.Digest}}}}{{{{range .RepoDigests}}}} {{{{.}}}}{{{{end}}}}' {q} "
                "2>/dev/null || true")

    def process(self, output: list[str]) -> list[str]:
        digests: list[str] = []
        for word in " ".join(output).split():
            digest = word.rsplit("@", 1)[-1]
            if digest.startswith("sha256:") and digest not in digests:
                digests.append(digest)
        return digests


class ServiceStartDict(TypedDict):
    unit: str | None      # hash of the unit and fabric env the service last started from (None: no record)
    snapshot: str | None  # hash of the snapshot stamp it started with
    verified: str | None  # hash of the snapshot stamp now (None: no stamp: not verified)
    manifest: str | None  # sha1 of the live trusted manifest now (None: none, or not asked for)


class ServiceStartedFrom(FactBase[ServiceStartDict]):
    """What the service's last start recorded in ``record`` (its unit writes two hashes there at every start:
    its unit and fabric env, and the snapshot stamp; deploys/service/unit.py), beside the hash of the
    snapshot stamp ``stamp`` now: a service whose snapshot was repaired since it started is restarted; and the sha1
    of the live trusted manifest ``manifest`` (which commit the live release is: another one asked for is a switch)."""

    def command(self, record: str, stamp: str, manifest: str | None = None) -> str:
        live = (f"echo '{_MARK}manifest'; sha1sum < {shlex.quote(manifest)} 2>/dev/null | cut -d' ' -f1; "
                if manifest else "")
        return (f"cat {shlex.quote(record)} 2>/dev/null; echo '{_MARK}now'; "
                f"sha256sum < {shlex.quote(stamp)} 2>/dev/null | cut -d' ' -f1; {live}true")

    def process(self, output: list[str]) -> ServiceStartDict:
        if f"{_MARK}now" not in output:
            raise FactProcessError(f"ServiceStartedFrom: no marker in {output!r}")
        at = output.index(f"{_MARK}now")
        end = output.index(f"{_MARK}manifest") if f"{_MARK}manifest" in output else len(output)
        recorded = [line.strip() for line in output[:at] if line.strip()]
        now = [line.strip() for line in output[at + 1:end] if line.strip()]
        live = [line.strip() for line in output[end + 1:] if line.strip()]
        complete = len(recorded) == 2
        return {"unit": recorded[0] if complete else None, "snapshot": recorded[1] if complete else None,
                "verified": now[0] if now else None, "manifest": live[0] if live else None}


class GatePassedDict(TypedDict):
    release: dict | None     # the record the converge wrote when the serving gate last passed (None: never)
    invocation: str | None   # the service's InvocationID now (None: not started since boot)


class GatePassed(FactBase[GatePassedDict]):
    """When the serving gate last passed on this head, for which release and which start of the service
    (``record``: written by the converge, deploys/service/switch.py), beside the service's start now."""

    def command(self, record: str, service: str) -> str:
        return (f"cat {shlex.quote(record)} 2>/dev/null; echo; echo '{_MARK}now'; "
                f"systemctl show -p InvocationID --value {shlex.quote(service)} 2>/dev/null; true")

    def process(self, output: list[str]) -> GatePassedDict:
        if f"{_MARK}now" not in output:
            raise FactProcessError(f"GatePassed: no marker in {output!r}")
        at = output.index(f"{_MARK}now")
        text = "\n".join(output[:at]).strip()
        try:
            release = json.loads(text) if text else None
        except ValueError:
            release = None  # a damaged record is no record: the gate runs again
        now = "".join(output[at + 1:]).strip()
        return {"release": release if isinstance(release, dict) else None, "invocation": now or None}


class JsonRecord(FactBase[dict]):
    """A JSON object the toolkit keeps on the node (``{}``: none, or not an object: a damaged record is none)."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null; true"

    def process(self, output: list[str]) -> dict:
        try:
            record = json.loads("\n".join(output)) if "".join(output).strip() else {}
        except ValueError:
            return {}
        return record if isinstance(record, dict) else {}


class ReleasesOnDiskDict(TypedDict):
    history: int         # how many releases passed the gate on this node (0: none, nothing is pruned)
    paths: list[str]     # model paths pruning would delete now (commits, cache blobs)
    images: list[str]    # image IDs it would remove
    recorded: bool       # the images were pruned for the newest release already (none are read then)


class ReleasesOnDisk(FactBase[ReleasesOnDiskDict]):
    """What pruning the node's past releases would delete now, read by the pruner itself with `--plan` (it
    changes nothing): files/model_snapshot/snapshot_releases.py. Before the pruner is installed: nothing."""

    @staticmethod
    def default() -> ReleasesOnDiskDict:
        return {"history": 0, "paths": [], "images": [], "recorded": True}

    def command(self, pruner: str, model_dir: str, layout: str, history: str, kept: int, keep: str, image: str) -> str:
        return (f"[ ! -f {shlex.quote(pruner)} ] || python3 {shlex.quote(pruner)} {shlex.quote(model_dir)} --layout "
                f"{shlex.quote(layout)} --history {shlex.quote(history)} --kept {int(kept)} --keep {shlex.quote(keep)} "
                f"--image {shlex.quote(image)} --plan")

    def process(self, output: list[str]) -> ReleasesOnDiskDict:
        text = "\n".join(output).strip()
        try:
            plan = json.loads(text) if text else {}
        except ValueError:
            raise FactProcessError(f"ReleasesOnDisk: not the pruner's plan: {text[-300:]!r}") from None
        return {"history": int(plan.get("history", 0)), "paths": list(plan.get("paths", [])),
                "images": list(plan.get("images", [])), "recorded": bool(plan.get("recorded", True))}


class ReleaseStanding(FactBase[dict]):
    """A head's release records in one read (deploys/lab_status.py): the release its last serving gate passed with,
    that gate's verdict, the releases that passed before (a list) and the failed-release record, each ``None`` when
    absent or unreadable (a damaged record is none)."""

    def command(self, passed: str, last: str, history: str, failed: str) -> str:
        paths = json.dumps({"passed": passed, "last": last, "history": history, "failed": failed})
        code = ("import json,sys\nout={}\nfor k,p in json.loads(sys.argv[1]).items():\n"
                " try:\n  out[k]=json.load(open(p))\n except Exception:\n  out[k]=None\nprint(json.dumps(out))")
        return f"python3 -c {shlex.quote(code)} {shlex.quote(paths)}"

    def process(self, output: list[str]) -> dict:
        try:
            seen = json.loads("\n".join(output))
        except ValueError as e:
            raise FactProcessError(f"release records: {e}") from None
        return {k: seen.get(k) for k in ("passed", "last", "history", "failed")}
