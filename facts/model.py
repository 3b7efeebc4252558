"""Facts about the model snapshot: the verifier's verdict on the node, the hub client and the node's Python."""

from __future__ import annotations

import json
import shlex
from typing import Any, TypedDict

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError


class ModelVerification(FactBase[dict]):
    """Run the node's verifier (stamp fast path unless ``full`` or no full re-hash is on record) and return
    its JSON verdict (a full run records its verdict in ``record``; a bad one only over a record of the same manifest:
    before an upgrade's sync the new commit's files are missing, which says nothing of the release that serves).
    ``plan``: write and hash nothing (what a converge's plan may do: where the stamp cannot vouch, the verdict says
    ``needs_hash``).

    ``{"ok": False, "not_installed": True}`` until the verifier and manifest are on the node.
    """

    default = dict

    def command(self, verifier: str, manifest: str, snapshot_dir: str, stamp: str, record: str,
                full: bool = False, plan: bool = False, stale_after_s: int = 0, max_rate: int | None = None) -> str:
        """``stale_after_s``: a record older than this asks for a full re-hash too (the deep verify's timer missed
        its window: it does not catch up at boot). ``max_rate``: the read-rate cap of a full re-hash, MB/s."""
        v, m, d, s, r = (shlex.quote(x) for x in (verifier, manifest, snapshot_dir, stamp, record))
        # a full re-hash when asked, on a node that has no record of one (new, or upgraded to the timer), and on
        # one whose record is stale
        fresh = f"-n \"$(find {r} -mmin -{max(1, stale_after_s // 60)} 2>/dev/null)\"" if stale_after_s else f"-f {r}"
        flags = (" --full" if full else f" $([ {fresh} ] || echo --full)") + (" --plan" if plan else "")
        flags += f" --max-rate {int(max_rate)}" if max_rate else ""
        return (
            f"if [ -f {v} ] && [ -f {m} ]; then python3 {v} {m} {d} --stamp {s} --record {r} --sync-check --json "
            f"--quiet{flags}; "
            f"[ $? -le 1 ]; else echo '{{\"ok\": false, \"not_installed\": true}}'; fi"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError) as e:
            raise FactProcessError(f"ModelVerification: unexpected verifier output {output[-3:]!r}") from e


class HubClientDict(TypedDict):
    version: str | None  # huggingface_hub's version in the venv; None: not installed
    lock_sha256: str | None  # of the lock the venv was installed from (kept in the venv); None: none there


class HubClient(FactBase[HubClientDict]):
    """The hub client in ``venv`` on the node: huggingface_hub's version, and the sha256 of the lock file
    ``lock_name`` kept beside it, in one round trip."""

    def command(self, venv: str, lock_name: str) -> str:
        python, lock = shlex.quote(f"{venv}/bin/python"), shlex.quote(f"{venv}/{lock_name}")
        return (f"echo \"version=$({python} -c 'import huggingface_hub as h; print(h.__version__)' 2>/dev/null)\"; "
                f"echo \"lock_sha256=$(sha256sum {lock} 2>/dev/null | cut -c1-64)\"")

    def process(self, output: list[str]) -> HubClientDict:
        values = dict(line.split("=", 1) for line in output if "=" in line)
        return {"version": values.get("version", "").strip() or None,
                "lock_sha256": values.get("lock_sha256", "").strip() or None}


class NodePythonDict(TypedDict):
    version: str  # major and minor as wheel tags write them: "311"
    machine: str  # platform.machine(): "x86_64", "aarch64"


class NodePython(FactBase[NodePythonDict]):
    """The node's python3: its version and CPU, which pick the hub client's wheels (deploys/model/hub_lock.py)."""

    def command(self) -> str:
        return "python3 -c 'import sys, platform; print(sys.version_info[0], sys.version_info[1], platform.machine())'"

    def process(self, output: list[str]) -> NodePythonDict:
        words = " ".join(output).split()
        if len(words) != 3 or not (words[0] + words[1]).isdigit():
            raise FactProcessError(f"NodePython: unexpected output {output!r}")
        return {"version": words[0] + words[1], "machine": words[2]}


class SeedDaemonDict(TypedDict):
    running: bool  # the seed daemon's unit is active or activating
    secret_dir: bool  # its run-secret directory exists


class SeedDaemon(FactBase[SeedDaemonDict]):
    """What a push fan-out's seed daemon left on a node (deploys/model/fanout.py): its unit running, its run-secret
    directory present."""

    def command(self, unit: str, secret_dir: str) -> str:
        return (f"systemctl is-active {shlex.quote(unit)} 2>/dev/null; "
                f"test -d {shlex.quote(secret_dir)} && echo seed-dir; true")

    def process(self, output: list[str]) -> SeedDaemonDict:
        seen = " ".join(output).split()
        return {"running": seen[:1] in (["active"], ["activating"]), "secret_dir": "seed-dir" in seen}
