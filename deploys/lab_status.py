"""Where the lab stands: per cluster, the release its head serves (as its last serving gate passed it), the one it
served before, and its state against the inventory, read from every head in one command each (read-only).

    python -m deploys.lab_status INVENTORY [--limit HOST_GROUP_OR_CLUSTER ...] [--json]

States (``cluster_standing``; a release is its id: the unit, its environments and the model manifest hashed, as the
converge names it): `live` (the inventory's release serves, gated), `behind inventory` (another release
serves: the next converge or rollout switches it), `failed, rolled back` (the inventory's release failed here and the
previous one serves again: a converge holds its switch back until `retry_failed_release`), `failed, not serving`, `gate
failing` (the release that serves failed its last gate: a hand-run audit or a failed restart), `not deployed` (no gate
ever passed), `unreachable`. Exit 0 when every cluster is `live`, 1 otherwise, 2 on a bad inventory or limit.
"""

from __future__ import annotations

import argparse
import json
import sys

from deploys.inventory import LimitError, limited_hosts, load_inventory
from deploys.schema import InventoryValidationError, NodeConfig, clusters, validate_inventory
from deploys.service.release import failed_release_path, gate_last_path, gate_record_path, release_history_path
from facts.containers import ReleaseStanding

COLUMNS = ("cluster", "head", "state", "serves: image @ model commit (release)", "gated at", "output tok/s (vs before it)", "before it",
           "asked by the inventory")
LIVE = "live"


def standing_paths(cfg: NodeConfig) -> dict[str, str]:
    """The head's records the standing is read from (ReleaseStanding's arguments)."""
    return {"passed": gate_record_path(cfg), "last": gate_last_path(cfg), "history": release_history_path(cfg),
            "failed": failed_release_path(cfg)}


def _release(record: dict | None) -> dict | None:
    if not record or not record.get("image"):
        return None
    return {k: record.get(k) for k in ("release", "image", "model_revision", "passed_at", "bench")
            if record.get(k) is not None}


def same_release(a: dict | None, b: dict | None) -> bool:
    """Two releases are the same: their release ids (the unit, its environments and the model manifest, hashed), or
    where one has none, their image and model commit."""
    if not (a and b):
        return False
    if a.get("release") and b.get("release"):
        return a["release"] == b["release"]
    return (a.get("image"), a.get("model_revision")) == (b.get("image"), b.get("model_revision"))


def asked_release(configs: dict[str, NodeConfig], head: str) -> dict:
    """The release the inventory asks of ``head``'s cluster, with its id as the converge computes it (release_of)."""
    from deploys.schema import cluster_of
    from deploys.service.release import release_of
    from deploys.service.unit import fingerprint, render_container

    cfg, cluster = configs[head], cluster_of(configs, head)
    unit = render_container(cfg, cluster.head, cluster.size, cluster.members)
    released = release_of(cfg, fingerprint(unit, cfg, cluster.head, cluster.size))
    return {k: released[k] for k in ("release", "image", "model_revision")}


def cluster_standing(cluster: str, head: str, cfg: NodeConfig, seen: dict | None, asked: dict | None = None) -> dict:
    """One cluster's row from what its head keeps (``seen``: ReleaseStanding's answer; None: not reached); ``asked``:
    the release the inventory asks (asked_release; default: its image and model commit, no id)."""
    asked = asked or {"image": cfg.image_ref, "model_revision": cfg.model_revision}
    row = {"cluster": cluster, "head": head, "asked": asked, "live": None, "previous": None, "failed": None,
           "last_gate": None}
    if seen is None:
        return {**row, "state": "unreachable"}
    live = _release(seen.get("passed"))
    history = [e for e in (seen.get("history") or []) if isinstance(e, dict)]
    previous = next((_release(e) for e in reversed(history) if live is None or e.get("release") != live.get("release")),
                    None)
    failed = seen.get("failed") or None
    last = seen.get("last") or None
    row.update(live=live, previous=previous, failed=failed, last_gate=last)
    if failed and same_release(failed, asked) and not same_release(live, asked):
        state = "failed, rolled back" if live else "failed, not serving"
    elif live is None:
        state = "not deployed"
    elif last and last.get("ok") is False and last.get("release") == live.get("release"):
        state = "gate failing"
    elif same_release(live, asked):
        state = LIVE
    else:
        state = "behind inventory"
    return {**row, "state": state}


def _named(release: dict | None) -> str:
    """Image (digest shortened) @ model commit, then the release id: two releases of one image and commit differ in
    their unit or environment, which only the id tells apart."""
    if not release:
        return "-"
    image = str(release.get("image"))
    name, digest = image.split("@sha256:", 1) if "@sha256:" in image else (image, "")
    named = f"{name}{'@sha256:' + digest[:12] if digest else ''} @ {str(release.get('model_revision') or '?')[:12]}"
    return f"{named} ({release['release']})" if release.get("release") else named


def performance_told(live: dict | None, previous: dict | None) -> str:
    """The release bench's output tok/s per concurrency of the release that serves, with its change from the one
    before it where both were benched at that level ("-": not benched)."""
    was = {b.get("concurrency"): b for b in ((previous or {}).get("bench") or []) if isinstance(b, dict)}
    parts = []
    for level in (live or {}).get("bench") or []:
        before = was.get(level.get("concurrency"), {}).get("output_tok_s")
        change = f" ({100 * (level['output_tok_s'] / before - 1):+.0f} %)" if before else ""
        parts.append(f"c{level.get('concurrency')}: {level.get('output_tok_s'):g}{change}")
    return ", ".join(parts) or "-"


def format_table(rows: list[dict]) -> str:
    cells = [[r["cluster"], r["head"], r["state"], _named(r["live"]), (r["live"] or {}).get("passed_at", "-"),
              performance_told(r["live"], r["previous"]), _named(r["previous"]),
              "(same)" if same_release(r["live"], r["asked"]) else _named(r["asked"])] for r in rows]
    widths = [max(len(str(c[i])) for c in [list(COLUMNS), *cells]) for i in range(len(COLUMNS))]
    line = lambda c: "  ".join(str(x).ljust(w) for x, w in zip(c, widths)).rstrip()  # noqa: E731
    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *map(line, cells)])


def heads(configs: dict[str, NodeConfig], selected: set[str] | None) -> list[tuple[str, str, NodeConfig]]:
    """(cluster, head's name, head's config) of every cluster with a host in ``selected`` (all when None)."""
    out = []
    for cluster, members in clusters(configs).items():
        if selected is not None and not any(name in selected for name, _ in members):
            continue
        out += [(cluster, name, cfg) for name, cfg in members if cfg.is_head]
    return out


def read_standings(inventory, wanted: list[tuple[str, str, NodeConfig]]) -> dict[str, dict | None]:
    """Each head's ReleaseStanding, through pyinfra's own connection (its SSH settings, sudo as the inventory says);
    None for a head it cannot reach or read."""
    import logging

    from pyinfra.api import Config, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.facts import get_fact

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # (a head not reached is its row's state, not a traceback)
    state = State(inventory, Config())
    names = {name for _, name, _ in wanted}
    state.limit_hosts = [h for h in inventory if h.name in names]
    try:
        connect_all(state)
    except PyinfraError:  # none could be reached: each row says so
        pass
    out: dict[str, dict | None] = {}
    try:
        for _, name, cfg in wanted:
            host = inventory.get_host(name)
            if host not in state.activated_hosts:
                out[name] = None
                continue
            try:
                out[name] = get_fact(state, host, ReleaseStanding, args=(), kwargs=standing_paths(cfg))
            except Exception:  # noqa: BLE001 - a head that cannot be read is said as such, the others still are
                out[name] = None
    finally:
        for host in inventory:
            host.disconnect()
    return out


def standings(inventory, configs: dict[str, NodeConfig], wanted: list[tuple[str, str, NodeConfig]]) -> list[dict]:
    """The rows of ``wanted`` (heads()), each head read once (read_standings) and judged against its inventory's ask."""
    seen = read_standings(inventory, wanted)
    return [cluster_standing(cluster, name, cfg, seen.get(name), asked_release(configs, name))
            for cluster, name, cfg in wanted]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploys.lab_status", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("--limit", action="append", default=[], help="a host, group or cluster (glob; repeatable)")
    parser.add_argument("--json", action="store_true", help="one JSON object per cluster, as a list")
    args = parser.parse_args(argv)
    inventory = load_inventory(args.inventory)
    try:
        limit = limited_hosts(inventory, args.limit)
        configs = validate_inventory(inventory, limit)
    except (LimitError, InventoryValidationError) as e:
        print(e, file=sys.stderr)
        return 2
    rows = standings(inventory, configs, heads(configs, None if limit is None else {h.name for h in limit}))
    print(json.dumps(rows, indent=1, sort_keys=True) if args.json else format_table(rows))
    return 0 if all(r["state"] == LIVE for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
