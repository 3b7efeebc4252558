"""A rollout's ledger on the control node: which release each cluster is asked for, the waves, and where each cluster
stands in this rollout, so that `--resume` after a halt, a kill or a lost connection continues deterministically.
Kept outside the repository ($XDG_STATE_HOME/inference-nodes/rollouts/, 0600 in a 0700 directory), written whole
through a temporary file and a rename: a kill leaves the ledger before or after a change, never half of one."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

# a cluster in this rollout: not yet touched, its release staged beside the live one, switched and gated, failed
# (its switch rolled back by the lifecycle, or its stage failed), rolled back by `--abort` to the release before
STATES = ("pending", "staged", "switched", "failed", "rolled back")


def ledger_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "inference-nodes", "rollouts")


def ledger_path(inventory_file: str) -> str:
    """One ledger per inventory file (its absolute path, hashed: two labs' inventories never share one)."""
    real = os.path.realpath(inventory_file)
    stem = os.path.splitext(os.path.basename(real))[0]
    return os.path.join(ledger_dir(), f"{stem}-{hashlib.sha256(real.encode()).hexdigest()[:12]}.json")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class ClusterEntry:
    asked: dict                    # the release the inventory asks for: {"image", "model_revision"}
    state: str = "pending"
    at: str | None = None          # when the state was reached
    why: str | None = None         # a failure's first line
    before: dict | None = None     # the release that served when the rollout began (lab_status's "live")
    after: dict | None = None      # the release it switched to, as its head keeps it: with its release bench figures


@dataclass
class Ledger:
    inventory: str
    waves: list[list[str]]
    clusters: dict[str, ClusterEntry]
    started_at: str = field(default_factory=now)
    halted: str | None = None      # why the rollout stopped (None: running or done)
    aborted: str | None = None     # when `--abort` ended it (its switched clusters rolled back)

    def mark(self, cluster: str, state: str, why: str | None = None) -> None:
        if state not in STATES:
            raise ValueError(f"state {state}: one of {', '.join(STATES)}")
        entry = self.clusters[cluster]
        entry.state, entry.at, entry.why = state, now(), why

    def done(self, cluster: str) -> bool:
        """Switched to the release this ledger asks of it (a resume leaves it as it is)."""
        return self.clusters[cluster].state == "switched"

    def unfinished(self) -> bool:
        """Stopped before every cluster switched, and not aborted since (what `--resume` continues); an abort that
        could not roll every switched cluster back leaves it unfinished too."""
        if self.aborted:
            return any(e.state in ("switched", "failed") for e in self.clusters.values())
        return any(e.state != "switched" for e in self.clusters.values())

    def remaining_waves(self) -> list[list[str]]:
        """The planned waves without the clusters already switched (empty waves dropped): what a resume runs."""
        return [left for wave in self.waves if (left := [c for c in wave if not self.done(c)])]

    def as_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"


def load(path: str) -> Ledger | None:
    """The ledger at ``path`` (None: none yet). A damaged one is an error naming the file, never a fresh start."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise ValueError(f"rollout ledger {path} is damaged ({e}): move it aside to start over") from None
    clusters = {name: ClusterEntry(**entry) for name, entry in data.pop("clusters").items()}
    return Ledger(clusters=clusters, **data)


def save(path: str, ledger: Ledger) -> None:
    """Write the whole ledger (0600) through a temporary in the same directory and a rename."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(ledger.as_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def resumed(ledger: Ledger, asked: dict[str, dict]) -> Ledger:
    """The ledger a `--resume` continues with, the inventory fixed since the halt: a cluster asked for another release
    than the ledger recorded (the fix) is pending again, whatever it reached; the others keep their state; the halt is
    cleared. ``asked``: cluster -> the release the inventory asks now."""
    for cluster, entry in ledger.clusters.items():
        if cluster in asked and asked[cluster] != entry.asked:
            entry.asked, entry.state, entry.at, entry.why = asked[cluster], "pending", now(), None
        elif entry.state == "failed":
            entry.state, entry.why = "pending", None
    ledger.halted = None
    return ledger
