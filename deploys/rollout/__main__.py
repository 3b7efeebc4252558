"""Roll a change out across the lab: stage every targeted cluster first, in parallel, while their live releases serve
(`release_stage_only`: image, model, unit staged and checked; no switch), then switch in waves, a canary wave first
(deploys/rollout/plan.py), each wave one `pyinfra -y INVENTORY deploys/all.py --limit <its clusters> --data
release_bench=true` (the lifecycle's door, gate and rollback as in any converge; each head benchmarks the release
after its gate, and one slower than its last good release fails like a failed gate: deploys/service/bench.py). The
first failure halts: the failed cluster was rolled back by its converge, no further cluster switches, the run exits
1 and prints where every cluster stands. A ledger on the control node (deploys/rollout/ledger.py) makes `--resume`
continue from the halted wave once the inventory is fixed, and `--abort` roll every cluster it switched back to the
release it served before (deploys/roll_back.py).

    python -m deploys.rollout INVENTORY [--limit CLUSTER ...] [--serial 1 25% 100%] [--max-down N] [--bake-s S]
                                        [--no-bench] [--resume | --abort] [--plan]

`--plan` prints the waves and changes nothing. `--bake-s S`: after each wave, S seconds during which the toolkit's
alerts for its clusters must stay quiet (read from the monitoring host's Prometheus) and its heads stay live.
Exit 0: every cluster switched; 1: halted (the ledger says where); 2: a bad inventory, option or ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from deploys import lab_status
from deploys.inventory import LimitError, limited_hosts, load_inventory
from deploys.rollout import ledger as ledgers
from deploys.rollout.plan import PlanError, parse_serial, plan_waves
from deploys.schema import InventoryValidationError, clusters, validate_inventory

PYINFRA = os.path.join(os.path.dirname(sys.executable), "pyinfra")
BENCH = ("--data", "release_bench=true")  # each head benchmarks the release it switched to (deploys/service/bench.py)


def say(text: str) -> None:
    print(f"rollout: {text}", flush=True)


def converge(inventory_file: str, cluster_names: list[str], *extra: str,
             deploy: str = "deploys/all.py") -> tuple[bool, set[str], str]:
    """One `pyinfra -y` run of ``deploy`` limited to ``cluster_names`` (its progress on this terminal): (it ran to
    the end, the hosts it failed, why when it did not run at all)."""
    limits = [a for c in cluster_names for a in ("--limit", c)]
    proc = subprocess.run([PYINFRA, "-y", "--json", inventory_file, deploy, *limits, *extra],
                          stdout=subprocess.PIPE, text=True)
    try:
        results = json.loads(proc.stdout)["results"]
    except (ValueError, KeyError, TypeError):
        return False, set(), f"pyinfra exited {proc.returncode} without results (see its words above)"
    return True, set(results.get("failed_hosts") or []), ""


def members_by_cluster(configs) -> dict[str, list[str]]:
    return {cluster: [name for name, _ in members] for cluster, members in clusters(configs).items()}


def failed_clusters(failed_hosts: set[str], members: dict[str, list[str]], ran: list[str]) -> list[str]:
    return [c for c in ran if failed_hosts & set(members[c])]


def quiet(inventory, configs, wave: list[str], bake_s: int) -> str | None:
    """After ``bake_s`` seconds: why the wave is not healthy (a firing alert of the toolkit's on one of its clusters, a
    head no longer live), or None."""
    from deploys.monitoring.node import monitoring_host_name

    time.sleep(bake_s)
    heads = [(c, n, cfg) for c, n, cfg in lab_status.heads(configs, None) if c in wave]
    for row in lab_status.standings(inventory, configs, heads):
        if row["state"] != lab_status.LIVE:
            return f"cluster {row['cluster']} is {row['state']} after the bake"
    watcher = monitoring_host_name(inventory)
    if watcher is None:
        return None
    firing = firing_alerts(inventory, watcher)
    if firing is None:
        return f"the monitoring host {watcher}'s Prometheus could not be read"
    loud = sorted({f"{a['alertname']} on {a.get('host')}" for a in firing if a.get("cluster") in wave})
    return f"alerts firing during the bake: {', '.join(loud)}" if loud else None


def firing_alerts(inventory, watcher: str) -> list[dict] | None:
    """The labels of every firing alert but the Watchdog on the monitoring host's Prometheus (None: not read)."""
    from pyinfra.api import Config, State
    from pyinfra.api.connect import connect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.facts import get_fact

    from deploys.inventory import host_config
    from facts.host import FiringAlerts

    state = State(inventory, Config())
    state.limit_hosts = [inventory.get_host(watcher)]
    try:
        connect_all(state)
        host = inventory.get_host(watcher)
        return get_fact(state, host, FiringAlerts, args=(), kwargs={"port": host_config(host).prometheus_port})
    except PyinfraError:
        return None
    finally:
        for host in inventory:
            host.disconnect()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploys.rollout", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("--limit", action="append", default=[], help="a cluster, group or host (whole clusters roll)")
    parser.add_argument("--serial", nargs="+", default=[], help="wave sizes after the canary: 1 25%% 100%% (the last "
                        "repeats; default: everything after the canary at once)")
    parser.add_argument("--max-down", type=int, default=None, help="at most this many clusters switch at once")
    parser.add_argument("--bake-s", type=int, default=0, help="seconds after each wave its alerts must stay quiet")
    parser.add_argument("--no-bench", action="store_true", help="no release bench after each head's gate (it runs "
                        "by default: a release slower than the last good one fails its switch)")
    parser.add_argument("--resume", action="store_true", help="continue a halted rollout (the inventory fixed)")
    parser.add_argument("--abort", action="store_true", help="roll every cluster this rollout switched back to the "
                        "release it served before")
    parser.add_argument("--plan", action="store_true", help="print the waves; change nothing")
    args = parser.parse_args(argv)
    inventory = load_inventory(args.inventory)
    try:
        limit = limited_hosts(inventory, args.limit)
        configs = validate_inventory(inventory, limit)
        selected = None if limit is None else {h.name for h in limit}
        heads = lab_status.heads(configs, selected)
        targeted = [cluster for cluster, _, _ in heads]
        canaries = [cluster for cluster, _, cfg in heads if cfg.rollout_canary]
        waves = plan_waves(targeted, canaries, parse_serial(args.serial), args.max_down)
        path = ledgers.ledger_path(args.inventory)
        ledger = ledgers.load(path)
    except (LimitError, InventoryValidationError, PlanError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    asked = {cluster: lab_status.asked_release(configs, name) for cluster, name, _ in heads}
    unfinished = ledger is not None and ledger.unfinished()
    if args.abort:
        if ledger is None or args.resume or args.plan:
            print(f"rollout: {'--abort takes no --resume or --plan' if ledger else f'no rollout to abort ({path})'}",
                  file=sys.stderr)
            return 2
        return abort(args, inventory, configs, ledger, path)
    if unfinished and ledger.aborted and not args.plan:
        print(f"rollout: the abort of a rollout of {args.inventory} left clusters switched ({path}): --abort again "
              "once the cause is fixed", file=sys.stderr)
        return 2
    if args.resume:
        if not unfinished:
            print(f"rollout: nothing to resume ({path} holds no unfinished rollout)", file=sys.stderr)
            return 2
        ledger = ledgers.resumed(ledger, asked)
    elif unfinished and not args.plan:
        print(f"rollout: a rollout of {args.inventory} stopped unfinished ({ledger.halted or 'killed'}; {path}): "
              "--resume once the inventory is fixed, --abort to roll back the clusters it switched, or move the "
              "ledger aside to start over", file=sys.stderr)
        return 2
    else:
        ledger = ledgers.Ledger(inventory=os.path.realpath(args.inventory), waves=waves,
                                clusters={c: ledgers.ClusterEntry(asked=asked[c]) for c in targeted})
    if args.plan:
        for i, wave in enumerate(ledger.remaining_waves()):
            print(f"wave {i}{' (canary)' if i == 0 and not args.resume else ''}: {', '.join(wave)}")
        return 0
    if not args.resume:
        seen = lab_status.read_standings(inventory, heads)
        for cluster, name, cfg in heads:
            ledger.clusters[cluster].before = lab_status.cluster_standing(cluster, name, cfg, seen.get(name))["live"]
    ledgers.save(path, ledger)
    return carry_out(args, inventory, configs, ledger, path)


def carry_out(args, inventory, configs, ledger: ledgers.Ledger, path: str) -> int:
    """Stage every cluster still to switch, then the waves; the ledger saved after each step."""
    members = members_by_cluster(configs)
    to_switch = [c for wave in ledger.remaining_waves() for c in wave]
    to_stage = [c for c in to_switch if ledger.clusters[c].state != "staged"]
    if to_stage:
        say(f"staging {', '.join(to_stage)} beside their live releases (no switch)")
        ran, failed_hosts, why = converge(args.inventory, to_stage, "--data", "release_stage_only=true")
        failed = failed_clusters(failed_hosts, members, to_stage) if ran else list(to_stage)
        for c in to_stage:
            ledger.mark(c, "failed" if c in failed else "staged", why or ("its stage failed" if c in failed else None))
        if failed:
            return halted(inventory, configs, ledger, path, f"the stage failed on {', '.join(failed)}: no cluster "
                          "switched")
        ledgers.save(path, ledger)
    for i, wave in enumerate(ledger.remaining_waves()):
        say(f"wave {i}: switching {', '.join(wave)}")
        ran, failed_hosts, why = converge(args.inventory, wave, *([] if args.no_bench else BENCH))
        failed = failed_clusters(failed_hosts, members, wave) if ran else list(wave)
        for c in wave:
            ledger.mark(c, "failed" if c in failed else "switched",
                        why or ("its switch failed (its converge rolled it back)" if c in failed else None))
        if failed:
            return halted(inventory, configs, ledger, path, f"wave {i} failed on {', '.join(failed)}")
        for row in lab_status.standings(inventory, configs, [h for h in lab_status.heads(configs, None) if h[0] in wave]):
            ledger.clusters[row["cluster"]].after = row["live"]  # (its performance record kept in the ledger too)
        ledgers.save(path, ledger)
        if args.bake_s and (loud := quiet(inventory, configs, wave, args.bake_s)):
            for c in wave:
                ledger.mark(c, "failed", loud)
            return halted(inventory, configs, ledger, path, f"wave {i}: {loud}")
    ledgers.save(path, ledger)
    say(f"every cluster switched ({', '.join(ledger.clusters)}); ledger {path}")
    print(lab_status.format_table(lab_status.standings(inventory, configs, lab_status.heads(configs, None))))
    return 0


def abort(args, inventory, configs, ledger: ledgers.Ledger, path: str) -> int:
    """Every cluster this rollout switched (or tried to) goes back to the release it served before (deploys/roll_back.py, all in
    one run: each head takes its own cluster back, workers first, gated); the release it left is recorded as failed
    on its members, so a plain converge holds it back. Exit 0 when every one went back."""
    # switched, or failed after its switch (a loud bake leaves it on the new release; one its converge rolled back
    # serves the release before already, which its head finds: nothing changes there)
    switched = [c for c, e in ledger.clusters.items() if e.state in ("switched", "failed")]
    for c in [c for c in switched if lab_status.same_release(ledger.clusters[c].before, ledger.clusters[c].asked)]:
        ledger.mark(c, "rolled back", "it served this release before the rollout: nothing to undo")
        switched.remove(c)
    if switched:
        say(f"aborting: {', '.join(switched)} back to the releases they served before")
        leaving = sorted({ledger.clusters[c].asked["release"] for c in switched})
        ran, failed_hosts, why = converge(args.inventory, switched, "--data", f"roll_back_from={','.join(leaving)}",
                                          deploy="deploys/roll_back.py")
        members = members_by_cluster(configs)
        failed = failed_clusters(failed_hosts, members, switched) if ran else switched
        for c in switched:
            if c not in failed:
                ledger.mark(c, "rolled back")
            else:
                ledger.clusters[c].why = why or "its roll back failed (its error is above)"
    else:
        failed = []
        say("aborting: no cluster was switched by this rollout")
    ledger.aborted = ledgers.now()
    ledgers.save(path, ledger)
    if failed:
        say(f"not rolled back: {', '.join(failed)}; run --abort again once the cause is fixed (ledger {path})")
    print(lab_status.format_table(lab_status.standings(inventory, configs, lab_status.heads(configs, None))))
    return 1 if failed else 0


def halted(inventory, configs, ledger: ledgers.Ledger, path: str, why: str) -> int:
    ledger.halted = why
    ledgers.save(path, ledger)
    switched = [c for c, e in ledger.clusters.items() if e.state == "switched"]
    rest = [c for c, e in ledger.clusters.items() if e.state != "switched"]
    say(f"halted: {why}")
    say(f"on the new release: {', '.join(switched) or 'none'}; not switched: {', '.join(rest)}")
    say(f"fix the inventory, then: python -m deploys.rollout {ledger.inventory} --resume (ledger {path})")
    print(lab_status.format_table(lab_status.standings(inventory, configs, lab_status.heads(configs, None))))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
