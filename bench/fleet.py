#!/usr/bin/env python3
"""Fleet distribution benchmark (issue 44): the time until every node holds a verified snapshot, the control node's
traffic and each node's bytes in and out, on 1 to 32 light sandbox nodes (tests/sandbox/fleet.py) whose links are
capped with tc, for the `push` mode's fan-out (rsync in waves, deploys/model/fanout.py), the `swarm` mode (the model
step in that mode: `swarm-mode`, the first node seeding; `swarm-mode-super`, the control node super seeding) and the
swarm's helper alone (files/model_snapshot/swarm.py on libtorrent, the control node seeding; `swarm-super`: seeding
as BitTorrent's initial seeder); then swarm drills (one link ten times slower; one node killed at 40 % and booted
again) and the control plane at that size: a no-op run of the model step (per-host command count) and the model
audit (less the start gate, which the service step installs). Prints tables; not a test.

    python bench/fleet.py [--sizes 1,4,8,16,32] [--engines waves,swarm-mode,swarm-mode-super,swarm,swarm-super]
                          [--rate 32mbit] [--shards 8] [--shard-mb 32] [--fanout 2] [--piece-mib 4] [--drills slow,kill]
                          [--drill-nodes 8]

Each size boots its own nodes (their disks empty). The waves and swarm-mode run `pyinfra -y INV
bench/fleet_deploy.py` (the model's part of deploys/all.py) from the control node's namespace, the swarm runs the
helper on every node as a transient unit and the seed in the control node's namespace; both end with the verifier
(`--full`) on every node. The control copy is fetched from the stand-in hub once, before any timing (the hub is not
on a capped link). "× one node" is the time over that of the same engine's one-node row: one single-node copy at the
same link rate, with the same overhead. Traffic is counted on the switch's ports (Ethernet frames: TCP/IP headers
included). "CPU busy" is this machine's: near 100 % the machine, not the links, set the pace. Needs root, what `make
test` installs and python3-libtorrent. Ends with one line for automated checks:

    fleet: waves_32_x_one=X.XX waves_control_out_32_x_snapshot=Y.YY swarm-mode_32_x_one=... noop_32_x_one=Z.ZZ
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import shutil
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from deploys.model.fanout import fanout_waves  # noqa: E402
from deploys.model.snapshot import MANIFEST, VERIFIER, VERIFIER_FILES  # noqa: E402
from tests.sandbox import fleet  # noqa: E402

HUB_PORT, REPO, COMMIT = fleet.HUB_PORT, fleet.REPO, fleet.COMMIT
COUNTED = os.path.join(ROOT, "bench/pyinfra_counted.py")
MODEL_STEP = "bench/fleet_deploy.py"
SWARM = os.path.join(ROOT, "files/model_snapshot/swarm.py")
SWARM_MANIFEST_LIB = os.path.join(ROOT, "files/model_snapshot/snapshot_manifest.py")



def in_ctl(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(fleet.in_ns(fleet.CTL, *cmd), capture_output=True, text=True, cwd=ROOT, **kw)


def checked(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc


def cpu_ticks() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def one_node(runs: list[dict]) -> dict:
    """An engine's one-node row (its first row where none has one node): what "× one node" divides by."""
    return next((r for r in runs if r["nodes"] == 1), runs[0])


def figures(names: list[str], before: dict, after: dict, busy0: tuple[int, int], busy1: tuple[int, int]) -> dict:
    """The control node's and the nodes' traffic between two readings of the switch's counters, and how busy this
    machine's CPUs were in between."""
    moved = {n: {k: after[n][k] - before.get(n, {}).get(k, 0) for k in ("rx", "tx")} for n in after}
    return {"control_out": moved[fleet.CTL]["rx"], "node_in_max": max(moved[n]["tx"] for n in names),
            "node_out_max": max(moved[n]["rx"] for n in names),
            "cpu_busy": (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])}


SWARM_PORT = 6881
SWARM_LIB = "/usr/local/lib/inference-nodes"
SWARM_UNIT = "inference-nodes-model-swarm"


def tenth(rate: str) -> str:
    """A tenth of a tc rate ("32mbit" -> "3200kbit")."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]*)", rate).groups()
    scale = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1, "": 1}[unit]
    return f"{int(float(number) * scale / 10 / 1000)}kbit"


def swarm_size(count: int, args, work: str, manifest: str, size: int, seed_dir: str, drill: str | None = None,
               super_seed: bool = False) -> dict:
    """The swarm (files/model_snapshot/swarm.py, libtorrent) from the control node's copy to ``count`` nodes: the
    control node seeds, every node joins with every other as a peer; each node's time until its verifier (in full,
    as the model step runs it) passed. ``drill``: `slow` (the last node's link at a tenth of the rate) or `kill`
    (the second node killed, every process at once, at 40 % of the snapshot, booted again once the others are
    done, its swarm started again). The slow node is not waited for: what it held when the others were done."""
    names = [fleet.node_name(i) for i in range(count)]
    fleet.down(nodes_only=True)
    fleet.up(count, args.rate, None, {names[-1]: tenth(args.rate)} if drill == "slow" else {})
    torrent = os.path.join(work, f"snapshot-{args.piece_mib}.torrent")
    if not os.path.exists(torrent):
        checked(subprocess.run(["/usr/bin/python3", SWARM, "make", seed_dir, manifest, torrent, "--piece-mib",
                                str(args.piece_mib)], capture_output=True, text=True), "the torrent")
    peers = [f"{fleet.CTL_ADDRESS}:{SWARM_PORT}"] + [f"{fleet.node_address(i)}:{SWARM_PORT}" for i in range(count)]
    dest = f"/srv/swarm/{os.path.basename(seed_dir)}"
    state = "/var/lib/swarm-bench"  # on the node's disk: a killed node still has it when it boots again

    def staged(name: str) -> None:
        checked(fleet.ssh(name, f"mkdir -p {SWARM_LIB} {state} /srv/swarm"), f"mkdir on {name}")
        copies = [(SWARM, f"{SWARM_LIB}/swarm.py"), (manifest, f"{state}/manifest.json"),
                  (torrent, f"{state}/snapshot.torrent")]
        copies += [(os.path.join(ROOT, "files/model_snapshot", m), f"{SWARM_LIB}/{m}") for m in VERIFIER_FILES]
        for src, dst in copies:
            with open(src, "rb") as f:
                checked(fleet.ssh(name, f"cat > {dst}", stdin=f.read()), f"copy to {name}")

    def started(name: str) -> None:
        me = fleet.address_of(name)
        others = " ".join(f"--peer {p}" for p in peers if not p.startswith(me + ":"))
        checked(fleet.ssh(name, f"rm -f {state}/status.json; systemd-run --unit {SWARM_UNIT} --collect "
                                f"-p RuntimeMaxSec=7200 /usr/bin/python3 {SWARM_LIB}/swarm.py serve "
                                f"{state}/snapshot.torrent {dest} {state}/manifest.json --listen {me}:{SWARM_PORT} "
                                f"{others} --status {state}/status.json"), f"start on {name}")

    def status(name: str) -> dict:
        out = fleet.ssh(name, f"cat {state}/status.json 2>/dev/null", timeout=30).stdout
        try:
            return json.loads(out)
        except ValueError:
            return {}

    def reached(name: str, condition) -> dict:
        while not condition(st := status(name)):
            time.sleep(1)
        return st

    def verified(name: str, t0: float) -> tuple[float, dict]:
        """Seconds from ``t0`` until ``name`` held every piece and its verifier passed, and its last status."""
        st = reached(name, lambda st: st.get("seeding"))
        checked(fleet.ssh(name, f"python3 {SWARM_LIB}/verify_snapshot.py {state}/manifest.json {dest} --full",
                          timeout=900), f"the verifier on {name}")
        return time.monotonic() - t0, st

    victim = names[1] if drill == "kill" and count > 1 else None
    laggard = names[-1] if drill == "slow" else None  # not waited for: how far it got when the others were done
    with concurrent.futures.ThreadPoolExecutor(max(8, count)) as pool:
        list(pool.map(staged, names))
        before, busy0 = fleet.counters(), cpu_ticks()
        t0 = time.monotonic()
        seeder = subprocess.Popen(fleet.in_ns(fleet.CTL, "/usr/bin/python3", SWARM, "serve", torrent, seed_dir, manifest,
                                              "--listen", f"{fleet.CTL_ADDRESS}:{SWARM_PORT}", "--seed",
                                              *(["--super-seed"] if super_seed else []),
                                              *[a for p in peers[1:] for a in ("--peer", p)]),
                                  stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "seeder.log"), "w"))
        extra = {}
        try:
            list(pool.map(started, names))
            waits = {n: pool.submit(verified, n, t0) for n in names if n not in (victim, laggard)}
            if victim:
                st = reached(victim, lambda st: st.get("done", 0) >= 0.4 * size)
                fleet.stop(victim)
                extra["killed_at"] = st["done"]
            times = {n: w.result()[0] for n, w in waits.items()}
            if victim:
                fleet.start(victim)
                t1 = time.monotonic()
                started(victim)
                back, st = verified(victim, t1)
                extra.update(resumed_s=back, fetched_after=st["downloaded"])
            seconds = max(times.values())
            if laggard:
                extra["slow_done"] = status(laggard).get("done", 0)
            busy1, after = cpu_ticks(), fleet.counters()
        finally:
            seeder.terminate()
            list(pool.map(lambda n: fleet.ssh(n, f"systemctl stop {SWARM_UNIT}"), names))
    return {"nodes": count, "waves": "-", "seconds": seconds, **figures(names, before, after, busy0, busy1), **extra}


# the `swarm` mode's seeds: its first node (the default), or the control node offering each node only pieces no one
# holds yet
MODE_SEEDS = {"swarm-mode": {}, "swarm-mode-super": {"model_swarm_seed": "control", "model_swarm_super_seed": True,
                                                     "model_swarm_control_address": fleet.CTL_ADDRESS}}


def run_size(count: int, args, work: str, manifest: str, size: int, mode: str = "push",
             extra: dict | None = None) -> dict:
    """The model step itself (`pyinfra -y INV bench/fleet_deploy.py`) on ``count`` fresh nodes in ``mode``: `push`
    (the waves) or `swarm` (the sync mode: the first node seeds), then its no-op run and the model audit."""
    fleet.down(nodes_only=True)
    fleet.up(count, args.rate, None, {})
    inventory = os.path.join(work, f"fleet-{mode}-{count}.py")
    fleet.write_inventory(inventory, count, {
        "model_repo": REPO, "model_revision": COMMIT, "model_manifest": manifest,
        "model_hub_endpoint": f"http://127.0.0.1:{HUB_PORT}", "model_push_fanout": args.fanout,
        "model_control_cache": os.path.join(work, "control-cache"), "model_sync_mode": mode,
        "model_swarm_piece_mib": args.piece_mib, **(extra or {})})
    before, busy0 = fleet.counters(), cpu_ticks()
    t0 = time.monotonic()
    checked(in_ctl(sys.executable, "-m", "pyinfra", "-y", inventory, MODEL_STEP), f"the model step on {count} node(s)")
    seconds = time.monotonic() - t0
    busy1, after = cpu_ticks(), fleet.counters()
    names = [fleet.node_name(i) for i in range(count)]
    for name in names:
        checked(fleet.ssh(name, f"python3 {VERIFIER} {MANIFEST} /srv/model --full", timeout=600),
                f"the verifier on {name}")
    counts = os.path.join(work, f"counts-{mode}-{count}.json")
    t1 = time.monotonic()
    noop = checked(in_ctl(sys.executable, COUNTED, counts, "-y", "--json", inventory, MODEL_STEP),
                   f"the no-op model step on {count} node(s)")
    noop_s = time.monotonic() - t1
    changed = [op["name"] for op in json.loads(noop.stdout)["results"]["operations"] if op["success"]]
    with open(counts) as f:
        commands = [c["commands"] for c in json.load(f).values()]
    t2 = time.monotonic()
    checked(in_ctl(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/audit/test_model_snapshot.py",
                   "-k", "not start_gate", "--inventory", inventory), f"the model audit of {count} node(s)")
    audit_s = time.monotonic() - t2
    waves = 1 + max(a.wave for a in fanout_waves(names, args.fanout).values()) if mode == "push" else "-"
    return {"nodes": count, "waves": waves, "seconds": seconds, **figures(names, before, after, busy0, busy1),
            "noop_s": noop_s,
            "noop_changed": changed, "commands_per_host": max(commands), "audit_s": audit_s}


def tables(rows: dict[str, list[dict]], args, size: int) -> str:
    mib = size / 2**20
    out = [f"snapshot {mib:.0f} MiB ({args.shards} shards); every link {args.rate} each way, the control node's too; "
           f"waves: the `push` mode's fan-out (rsync, model_push_fanout={args.fanout}, the model step's whole run); "
           f"swarm: files/model_snapshot/swarm.py (libtorrent, pieces of {args.piece_mib} MiB, the control node "
           "seeding; swarm-super: seeding as an initial seeder), until every node's verifier passed", "",
           "| engine | nodes | waves | every node verified | × one node | control node out | × snapshot "
           "| node in (max) | node out (max) | CPU busy |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for engine, runs in rows.items():
        one = one_node(runs)
        for r in runs:
            out.append(f"| {engine} | {r['nodes']} | {r['waves']} | {r['seconds']:.1f} s "
                       f"| {r['seconds'] / one['seconds']:.2f} | {r['control_out'] / 2**20:.0f} MiB "
                       f"| {r['control_out'] / size:.2f} | {r['node_in_max'] / 2**20:.0f} MiB "
                       f"| {r['node_out_max'] / 2**20:.0f} MiB | {100 * r['cpu_busy']:.0f} % |")
    summary = []
    for engine, runs in rows.items():
        one, last = one_node(runs), runs[-1]
        summary.append(f"{engine}_{last['nodes']}_x_one={last['seconds'] / one['seconds']:.2f} "
                       f"{engine}_control_out_{last['nodes']}_x_snapshot={last['control_out'] / size:.2f}")
    steps = {e: rows[e] for e in ("waves", *MODE_SEEDS) if e in rows}  # the model step's own runs
    if steps:
        out += ["", "control plane (the model step's no-op run and the model audit, from the control node's "
                    "namespace)", "",
                "| mode | nodes | no-op run | × one node | changes | commands per host | audit |",
                "|---|---|---|---|---|---|---|"]
        for engine, runs in steps.items():
            one = one_node(runs)
            for r in runs:
                out.append(f"| {'push' if engine == 'waves' else engine} | {r['nodes']} | {r['noop_s']:.1f} s "
                           f"| {r['noop_s'] / one['noop_s']:.2f} | {len(r['noop_changed'])} "
                           f"| {r['commands_per_host']} | {r['audit_s']:.1f} s |")
            summary.append(f"noop_{'' if engine == 'waves' else engine + '_'}{runs[-1]['nodes']}_x_one="
                           f"{runs[-1]['noop_s'] / one['noop_s']:.2f}")
    return "\n".join(out + ["", "fleet: " + " ".join(summary)])


def drill_table(drills: dict[str, dict], swarm_rows: list[dict], args, size: int) -> str:
    plain = next((r for r in swarm_rows if r["nodes"] == args.drill_nodes), None)
    base = f"{plain['seconds']:.1f} s" if plain else "not run"
    out = ["", f"swarm drills on {args.drill_nodes} nodes (the same swarm without a drill: {base})", "",
           "| drill | the other nodes verified | the drilled node |", "|---|---|---|"]
    if "slow" in drills:
        d = drills["slow"]
        out.append(f"| one link at {tenth(args.rate)} | {d['seconds']:.1f} s | held {d['slow_done'] / 2**20:.0f} of "
                   f"{size / 2**20:.0f} MiB by then |")
    if "kill" in drills:
        d = drills["kill"]
        out.append(f"| one node killed at {d['killed_at'] / 2**20:.0f} of {size / 2**20:.0f} MiB "
                   f"| {d['seconds']:.1f} s | booted again: verified {d['resumed_s']:.1f} s later, "
                   f"{d['fetched_after'] / 2**20:.0f} MiB fetched after the boot |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,4,8,16,32")
    ap.add_argument("--engines", default="waves,swarm-mode,swarm-mode-super,swarm,swarm-super",
                    help="waves (the push mode's fan-out), swarm-mode (the model step in `swarm` mode, the first node "
                         "seeding), swarm-mode-super (the control node super seeding), swarm (the helper alone, the "
                         "control node seeding), swarm-super (the helper alone, the seed super seeding)")
    ap.add_argument("--rate", default="32mbit")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mb", type=float, default=32)
    ap.add_argument("--fanout", type=int, default=2)
    ap.add_argument("--piece-mib", type=int, default=4)
    ap.add_argument("--drills", default="slow,kill", help="swarm drills after the curve ('' for none)")
    ap.add_argument("--drill-nodes", type=int, default=8)
    args = ap.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    engines = args.engines.split(",")
    with tempfile.TemporaryDirectory(prefix="fleet-bench-", dir="/var/tmp") as work:
        fleet.down()
        fleet.control_node(args.rate)  # its namespace first: the hub runs there, and outlives each size's nodes
        hub, manifest, size = fleet.hub_started(work, args.shards, args.shard_mb)
        try:
            control = checked(in_ctl(sys.executable, "-m", "deploys.model.fetch", REPO, COMMIT, manifest,
                                     os.path.join(work, "control-cache"), f"http://127.0.0.1:{HUB_PORT}"),
                              "the control node's copy").stdout.strip().splitlines()[-1]
            seed_dir = os.path.join(work, "seed", COMMIT)  # the control copy's files themselves (its links followed)
            shutil.copytree(control, seed_dir, symlinks=False)
            rows: dict[str, list[dict]] = {}
            for engine in engines:
                for count in sizes:
                    row = (run_size(count, args, work, manifest, size) if engine == "waves"
                           else run_size(count, args, work, manifest, size, "swarm", MODE_SEEDS[engine])
                           if engine in MODE_SEEDS
                           else swarm_size(count, args, work, manifest, size, seed_dir, None,
                                         engine == "swarm-super"))
                    rows.setdefault(engine, []).append(row)
                    print(f"[fleet bench] {engine}, {count} node(s): {row['seconds']:.1f} s {json.dumps(row)}",
                          file=sys.stderr, flush=True)
            drills = {d: swarm_size(args.drill_nodes, args, work, manifest, size, seed_dir, d)
                      for d in filter(None, args.drills.split(","))}
            print(tables(rows, args, size))
            if drills:
                print(drill_table(drills, rows.get("swarm", []), args, size))
        finally:
            hub.terminate()
            fleet.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
