"""Health probe of one node of a multi-node vLLM job (Quadlet `HealthCmd=`, run inside the container).

    python3 job_probe.py --port MASTER_PORT --role head --nodes N
    python3 job_probe.py --port MASTER_PORT --role worker

vLLM's worker outlives its head ("Parent process exited", then nothing), and a head keeps serving with a
lost worker until a request fails. The head's torch.distributed store (`--master-port`) holds a TCP
connection from every process of the job while the job lives. So: a worker is healthy while one of its
own processes holds an established connection to that port; the head while its own processes hold at
least N established connections on it (one per node; its own client included), and still the same ones
as when the job formed: a worker that restarted alone (its node rebooted) connects anew, but cannot join
the running job, so the head's job is not whole and the head is restarted too. Only sockets owned by this
container's processes count (the network namespace may be shared: `Network=host`). Exit 0: healthy.
"""

import argparse
import os
import sys


def own_socket_inodes(proc: str = "/proc") -> set[str]:
    inodes = set()
    for pid in filter(str.isdigit, os.listdir(proc)):
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            for fd in os.listdir(fd_dir):
                target = os.readlink(os.path.join(fd_dir, fd))
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # the process ended, or is not ours to read
            continue
    return inodes


JOB_FILE = "/tmp/inference-nodes-job-peers"  # in the container's own /tmp: new with every container


def established(port: int, side: str, inodes: set[str], tables=("/proc/net/tcp", "/proc/net/tcp6")) -> int:
    """Established sockets owned by ``inodes`` whose local (side="local") or remote port is ``port``."""
    return len(peers(port, side, inodes, tables))


def peers(port: int, side: str, inodes: set[str], tables=("/proc/net/tcp", "/proc/net/tcp6")) -> list[str]:
    """The far ends (hex address:port) of those sockets."""
    out = []
    for table in tables:
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            address = local if side == "local" else remote
            if state == "01" and int(address.rsplit(":", 1)[1], 16) == port and inode in inodes:
                out.append(remote)
    return sorted(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--role", choices=("head", "worker"), required=True)
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args(argv)
    inodes = own_socket_inodes()
    if args.role == "head":
        now = peers(args.port, "local", inodes)
        print(f"head: {len(now)} connection(s) of the job on :{args.port}, {args.nodes} node(s) expected")
        if len(now) < args.nodes:
            return 1
        try:
            with open(JOB_FILE) as f:
                formed = f.read().split()
        except FileNotFoundError:  # the job has just formed: remember who is in it
            with open(JOB_FILE, "w") as f:
                f.write("\n".join(now) + "\n")
            return 0
        lost = sorted(set(formed) - set(now))
        if lost:
            print(f"head: {len(lost)} connection(s) of the job are gone (a node restarted): the job is not whole")
            return 1
        return 0
    n = established(args.port, "remote", inodes)
    print(f"worker: {n} connection(s) to the head's :{args.port}")
    return 0 if n >= 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
