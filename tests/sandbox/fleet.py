"""Light sandbox nodes for fleet-scale benchmarks (issue 44): 32 fit on this machine.

A light node is a Debian trixie rootfs with systemd, sshd, python3, rsync and python3-libtorrent (no Podman, no vLLM), booted with
`systemd-nspawn -b` on an overlay of one shared lower tree (a node costs its own writes only), in a network
namespace of its own. Every node's one interface (`eth0`) is a veth to one switch: a bridge in a namespace of the
harness's, so nothing of it is reachable from this machine's own network and nothing listens beyond it. The control
node is a namespace on the same switch (`ctl`, 10.44.0.1): commands run there (`fleet.py ctl -- CMD`) reach the
nodes at their addresses over the switch, as a lab's control node does.

Each link is capped both ways with tc (token bucket filters: the node's eth0 egress caps its upload, the switch
port's egress its download), so distribution is bound by links, as in a lab, not by this machine's memory bandwidth.
The control node's link gets the same rate unless told otherwise. Byte counters per switch port are the traffic
each node sent and received.

    python -m tests.sandbox.fleet up COUNT [--rate 64mbit] [--ctl-rate R] [--slow NAME=RATE ...]
    python -m tests.sandbox.fleet down
    python -m tests.sandbox.fleet counters          # JSON: {name: {"rx": bytes the node sent, "tx": received}}
    python -m tests.sandbox.fleet ctl -- CMD ...    # CMD in the control node's namespace
    python -m tests.sandbox.fleet stop NAME | start NAME   # a node killed (SIGKILL of all it runs) / booted again

Nodes are fleet-00, fleet-01, ... at 10.44.1.1, 10.44.1.2, ...; root logs in with FLEET_DIR/ssh/id_ed25519. The
light nodes have no package mirror: their apt lists count as fresh (the stamp is touched at every boot) and what
the model step needs (python3, rsync) is in the rootfs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time

FLEET_DIR = os.environ.get("FLEET_DIR", "/var/tmp/inference-nodes-fleet")
RUN_DIR = "/run/inference-nodes-fleet"
NS_DIR = f"{RUN_DIR}/ns"
MIRROR = os.environ.get("SANDBOX_MIRROR", "http://deb.debian.org/debian")
PKGS = "systemd,systemd-sysv,dbus,openssh-server,python3,rsync,python3-libtorrent,iproute2,procps,ca-certificates"
KEY = f"{FLEET_DIR}/ssh/id_ed25519"
CTL = "ctl"
CTL_ADDRESS = "10.44.0.1"
PREFIX = 16
CGROUP_ROOT = "/sys/fs/cgroup/unified"


def log(text: str) -> None:
    print(f"[fleet] {text}", file=sys.stderr, flush=True)


def sh(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


def node_name(index: int) -> str:
    return f"fleet-{index:02d}"


def node_address(index: int) -> str:
    """10.44.1.1 for the first node; 250 nodes a /24."""
    return str(ipaddress.ip_address("10.44.1.1") + (index // 250) * 256 + index % 250)


def ns_path(name: str) -> str:
    return f"{NS_DIR}/{name}"


def in_ns(name: str, *cmd: str) -> list[str]:
    return ["nsenter", f"--net={ns_path(name)}", *cmd]


def rootfs_tar() -> str:
    """The light rootfs, built once per package list (mmdebstrap, ~30 s)."""
    key = hashlib.sha256(PKGS.encode()).hexdigest()[:12]
    tar = f"{FLEET_DIR}/cache/light-trixie-{key}.tar"
    if not os.path.exists(tar):
        os.makedirs(os.path.dirname(tar), exist_ok=True)
        log(f"building the light rootfs (~30 s): {tar}")
        sh("mmdebstrap", "--quiet", "--variant=apt", "--mode=root", "--format=tar", f"--include={PKGS}",
           "--customize-hook=rm -f \"$1/etc/machine-id\"; touch \"$1/etc/machine-id\"",
           "trixie", tar + ".tmp", f"deb {MIRROR} trixie main")
        os.replace(tar + ".tmp", tar)
    return tar


def lower_tree() -> str:
    """The rootfs unpacked once: every node's overlay reads it."""
    tar = rootfs_tar()
    lower = tar[:-4] + ".d"
    if not os.path.exists(f"{lower}/.done"):
        shutil.rmtree(lower, ignore_errors=True)
        os.makedirs(lower)
        sh("tar", "-C", lower, "-xf", tar)
        open(f"{lower}/.done", "w").close()
    return lower


def ssh_key() -> None:
    if not os.path.exists(KEY):
        os.makedirs(os.path.dirname(KEY), mode=0o700, exist_ok=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", KEY, "-C", "inference-nodes-fleet")


def netns(name: str) -> None:
    """A persistent network namespace at ns_path(name) (a bind mount; not `ip netns add`, see sandbox-nodes.md)."""
    path = ns_path(name)
    if os.path.ismount(path):
        return
    os.makedirs(NS_DIR, exist_ok=True)
    open(path, "a").close()
    sh("unshare", f"--net={path}", "true")
    sh(*in_ns(name, "ip", "link", "set", "lo", "up"))


def cap(name: str, dev: str, rate: str) -> None:
    """Egress of ``dev`` in namespace ``name`` at ``rate`` (a token bucket filter; tc's rate units)."""
    sh(*in_ns(name, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb",
              "latency", "100ms"))


def switch() -> None:
    netns("sw")
    if sh(*in_ns("sw", "ip", "link", "show", "br0"), check=False).returncode != 0:
        sh(*in_ns("sw", "ip", "link", "add", "br0", "type", "bridge"))
        sh(*in_ns("sw", "ip", "link", "set", "br0", "up"))


def plug(name: str, address: str, rate: str) -> None:
    """``name``'s namespace on the switch: port `p-<name>` (its egress: ``name``'s download), eth0 in ``name``
    (its egress: the upload), both capped at ``rate``."""
    netns(name)
    port = f"p-{name}"[:15]
    if sh(*in_ns("sw", "ip", "link", "show", port), check=False).returncode == 0:
        sh(*in_ns("sw", "ip", "link", "del", port))
    sh(*in_ns("sw", "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns_path(name)))
    sh(*in_ns("sw", "ip", "link", "set", port, "master", "br0", "up"))
    sh(*in_ns(name, "ip", "addr", "add", f"{address}/{PREFIX}", "dev", "eth0"))
    sh(*in_ns(name, "ip", "link", "set", "eth0", "up"))
    cap("sw", port, rate)
    cap(name, "eth0", rate)
    if name != CTL and os.path.ismount(ns_path(CTL)):  # the control node forgets the address's last interface
        sh(*in_ns(CTL, "ip", "neigh", "flush", "to", address), check=False)


def node_dirs(name: str) -> dict[str, str]:
    base = f"{FLEET_DIR}/nodes/{name}"
    return {"base": base, "upper": f"{base}/upper", "work": f"{base}/work", "root": f"{base}/root",
            "pid": f"{RUN_DIR}/{name}.pid", "log": f"{base}/console.log"}


def boot(name: str, address: str) -> None:
    """Boot ``name`` (plugged already) on its overlay; returns once its sshd answers from the control node."""
    d = node_dirs(name)
    if not os.path.ismount(d["root"]):
        for k in ("upper", "work", "root"):
            os.makedirs(d[k], exist_ok=True)
        sh("mount", "-t", "overlay", "overlay", "-o",
           f"lowerdir={lower_tree()},upperdir={d['upper']},workdir={d['work']}", d["root"])
    root = d["root"]
    with open(f"{root}/etc/hostname", "w") as f:
        f.write(name + "\n")
    os.makedirs(f"{root}/root/.ssh", mode=0o700, exist_ok=True)
    shutil.copyfile(KEY + ".pub", f"{root}/root/.ssh/authorized_keys")
    os.chmod(f"{root}/root/.ssh/authorized_keys", 0o600)
    with open(f"{root}/etc/ssh/sshd_config.d/fleet.conf", "w") as f:
        f.write(f"ListenAddress {address}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "UseDNS no\nMaxStartups 100\n")
    os.makedirs(f"{root}/var/lib/apt/periodic", exist_ok=True)
    open(f"{root}/var/lib/apt/periodic/update-success-stamp", "w").close()  # no mirror here: the lists count as fresh
    cg = f"{CGROUP_ROOT}/inference-nodes-fleet-{name}"
    os.makedirs(cg, exist_ok=True)

    def own_cgroup() -> None:  # two nodes must not share one cgroup (tests/sandbox/node.sh, the supervisor)
        with open(f"{cg}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    with open(d["log"], "w") as console:
        proc = subprocess.Popen(
            ["systemd-nspawn", "-D", root, "-M", name, "-b", "--register=no", "--keep-unit", "--console=pipe",
             f"--network-namespace-path={ns_path(name)}", "--resolv-conf=off"],
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, env=env, preexec_fn=own_cgroup,
            start_new_session=True)
    with open(d["pid"], "w") as f:
        f.write(str(proc.pid))
    t0 = time.monotonic()
    while ssh(name, "systemctl is-system-running --wait >/dev/null 2>&1; true", timeout=10).returncode != 0:
        if proc.poll() is not None:
            raise RuntimeError(f"{name}: nspawn exited {proc.returncode}: {open(d['log']).read()[-2000:]}")
        if time.monotonic() - t0 > 120:
            raise RuntimeError(f"{name}: no sshd after 120 s")
        time.sleep(0.5)


def ssh_command(address: str) -> list[str]:
    return ["ssh", "-i", KEY, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
            # throwaway light node (the rootfs's host keys, shared): never these two for a real host
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            f"root@{address}"]


def address_of(name: str) -> str:
    return node_address(int(name.rsplit("-", 1)[1]))


def ssh(name: str, command: str, timeout: float = 120, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """``command`` on ``name`` from the control node's namespace (``stdin``: bytes it reads)."""
    try:
        proc = subprocess.run(in_ns(CTL, *ssh_command(address_of(name)), command), capture_output=True,
                              timeout=timeout, input=stdin)
        return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
                                           proc.stderr.decode(errors="replace"))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess([], 124, "", "timeout")


def running(name: str) -> int | None:
    """The node's nspawn PID while it runs. One that exited is reaped here when this process started it: a zombie
    answers kill(0) and kept each stop waiting its full 30 s (16 minutes to take 32 nodes down)."""
    try:
        pid = int(open(node_dirs(name)["pid"]).read())
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                return None
        return pid
    except (OSError, ValueError, IndexError):
        return None


def populated(cgroup: str) -> bool:
    """Whether any process is left in ``cgroup`` or below it (cgroup v2's own account)."""
    try:
        with open(f"{cgroup}/cgroup.events") as f:
            return "populated 1" in f.read()
    except OSError:
        return False


def stop(name: str) -> None:
    """Every process of the node killed at once (a power cut, as far as the node can tell); returns once its cgroup
    is empty and gone, so the next boot of the name starts in a cgroup of its own."""
    cg = f"{CGROUP_ROOT}/inference-nodes-fleet-{name}"
    for _ in range(120):
        if os.path.exists(f"{cg}/cgroup.kill"):
            with open(f"{cg}/cgroup.kill", "w") as f:
                f.write("1")
        running(name)  # reaps its nspawn, once that exited
        if not populated(cg):
            break
        time.sleep(0.25)
    sh("find", cg, "-depth", "-type", "d", "-exec", "rmdir", "{}", "+", check=False)


def names() -> list[str]:
    d = f"{FLEET_DIR}/nodes"
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def inotify_room(instances: int = 1024) -> None:
    """Every node's systemd holds inotify instances (about five once booted, more while it boots), all of uid 0:
    the kernel's default of 128 per user let about 25 nodes boot, then a node's nspawn exited 255 at its start."""
    path = "/proc/sys/fs/inotify/max_user_instances"
    if int(open(path).read()) < instances:
        with open(path, "w") as f:
            f.write(str(instances))


def control_node(rate: str) -> None:
    """The switch and the control node's namespace on it (kept when they are there already: what runs in the
    control node's namespace, a stand-in hub, outlives the nodes)."""
    ssh_key()
    inotify_room()
    switch()
    if not os.path.ismount(ns_path(CTL)):
        plug(CTL, CTL_ADDRESS, rate)


def up(count: int, rate: str, ctl_rate: str | None, slow: dict[str, str]) -> list[tuple[str, str]]:
    lower_tree()
    control_node(ctl_rate or rate)
    nodes = [(node_name(i), node_address(i)) for i in range(count)]
    for name, address in nodes:
        plug(name, address, slow.get(name, rate))
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: boot(*n), nodes))
    log(f"{count} light node(s) up in {time.monotonic() - t0:.1f} s, links at {rate}"
        + "".join(f", {n} at {r}" for n, r in slow.items()))
    return nodes


def start(name: str) -> None:
    boot(name, address_of(name))


def down(nodes_only: bool = False) -> None:
    """Every node stopped and its disk gone; with ``nodes_only`` the switch and the control node stay."""
    for name in names():
        stop(name)
        d = node_dirs(name)
        if os.path.ismount(d["root"]):
            sh("umount", d["root"], check=False)
        shutil.rmtree(d["base"], ignore_errors=True)
        if nodes_only:
            sh("umount", ns_path(name), check=False)
            if os.path.exists(ns_path(name)):
                os.unlink(ns_path(name))
    if nodes_only:
        return
    if os.path.isdir(NS_DIR):
        for ns in os.listdir(NS_DIR):
            sh("umount", ns_path(ns), check=False)
    shutil.rmtree(RUN_DIR, ignore_errors=True)
    log("fleet down")


HUB_PORT = 8812  # the stand-in hub, in the control node's namespace
REPO = "deepseek-ai/DeepSeek-V4-Flash-0731"
COMMIT = "7872f01b1d1fe23eabc4c98b48bffcef5a386062"


def hub_started(work: str, shards: int, shard_mb: float) -> tuple[subprocess.Popen, str, int]:
    """The stand-in hub (tests/sandbox/standin_hub.py) in the control node's namespace, serving REPO at COMMIT;
    its manifest (written under ``work``) and the snapshot's size."""
    log = open(os.path.join(work, "hub.log"), "w")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    hub = subprocess.Popen(in_ns(CTL, sys.executable, "-m", "tests.sandbox.standin_hub", "--port", str(HUB_PORT),
                                 "--shards", str(shards), "--shard-mb", str(shard_mb)),
                           cwd=root, stdout=log, stderr=subprocess.STDOUT)
    manifest = os.path.join(work, "manifest.json")
    for _ in range(600):
        proc = subprocess.run(in_ns(CTL, sys.executable, "-m", "deploys.model.manifest", REPO, COMMIT, "--endpoint",
                                    f"http://127.0.0.1:{HUB_PORT}", "--out", manifest),
                              capture_output=True, text=True, cwd=root)
        if proc.returncode == 0:
            break
        if hub.poll() is not None:
            break
        time.sleep(0.5)
    if proc.returncode != 0:
        hub.terminate()
        raise RuntimeError(f"the manifest from the stand-in hub: {(proc.stdout + proc.stderr)[-2000:]}")
    with open(manifest) as f:
        size = sum(e["size"] for e in json.load(f)["files"])
    return hub, manifest, size


def write_inventory(path: str, count: int, data: dict) -> None:
    """A pyinfra inventory of nodes fleet-00.. (a cluster of one each; what the schema needs of a GPU node is
    filled in, never used by the model step), `push` mode into /srv/model (plain layout), ``data`` on top."""
    common = {"ssh_user": "root", "ssh_key": KEY, "_sudo": False,
              # throwaway light nodes sharing the rootfs's host keys: never these two in a real inventory
              "ssh_strict_host_key_checking": "off", "ssh_known_hosts_file": "/dev/null",
              "image": "registry.home.arpa/vllm:deepseek-v4", "image_digest": "sha256:" + "0" * 64,
              "node_arch": os.uname().machine, "tensor_parallel_size": 1,
              "model_sync_mode": "push", "model_root": "/srv/model", "model_layout": "plain", **data}
    hosts = [(node_name(i), {"ssh_hostname": node_address(i), "cluster_name": node_name(i),
                             "model_peer_address": node_address(i), **common}) for i in range(count)]
    with open(path, "w") as f:
        f.write(f"# light fleet nodes (tests/sandbox/fleet.py); generated\nfleet = {hosts!r}\n")


def counters() -> dict[str, dict[str, int]]:
    """Bytes through each switch port: `rx` what the node sent, `tx` what it received."""
    links = json.loads(sh(*in_ns("sw", "ip", "-s", "-j", "link", "show")).stdout)
    return {link["ifname"][2:]: {"rx": link["stats64"]["rx"]["bytes"], "tx": link["stats64"]["tx"]["bytes"]}
            for link in links if link["ifname"].startswith("p-")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sandbox.fleet", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up")
    u.add_argument("count", type=int)
    u.add_argument("--rate", default="64mbit")
    u.add_argument("--ctl-rate")
    u.add_argument("--slow", action="append", default=[], metavar="NAME=RATE")
    sub.add_parser("down")
    sub.add_parser("counters")
    c = sub.add_parser("ctl")
    c.add_argument("command", nargs=argparse.REMAINDER)
    for verb in ("stop", "start"):
        sub.add_parser(verb).add_argument("name")
    a = p.parse_args(argv)
    if a.cmd == "up":
        for name, address in up(a.count, a.rate, a.ctl_rate, dict(s.split("=", 1) for s in a.slow)):
            print(name, address)
    elif a.cmd == "down":
        down()
    elif a.cmd == "counters":
        print(json.dumps(counters()))
    elif a.cmd == "ctl":
        cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
        os.execvp("nsenter", in_ns(CTL, *cmd))
    elif a.cmd == "stop":
        stop(a.name)
    elif a.cmd == "start":
        start(a.name)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
