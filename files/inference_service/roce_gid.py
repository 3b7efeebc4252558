#!/usr/bin/env python3
"""Find this node's RoCE v2 GID index for its fabric address, at service start (stdlib only).

    roce_gid.py ENV_FILE FABRIC_ADDRESS [--sysfs /sys]

GID indices differ between nodes and move after reboots or link changes, so they are never copied
into inventory: this runs as the unit's ExecStartPre and writes `NCCL_IB_GID_INDEX=<n>` (plus
`NCCL_IB_HCA=<device>`) to ENV_FILE. The chosen index is the RoCE v2 GID whose IPv4-mapped address
is the fabric address. Exit 1, naming what it saw, when there is none.
"""

import ipaddress
import os
import sys


def find_gid(sysfs: str, address: str) -> tuple[str, str, int] | None:
    """(device, port, index) of the RoCE v2 GID carrying ``address``."""
    want = ipaddress.ip_address(address)
    root = os.path.join(sysfs, "class", "infiniband")
    for dev in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        ports = os.path.join(root, dev, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            gids = os.path.join(ports, port, "gids")
            for name in sorted(os.listdir(gids), key=lambda n: int(n)) if os.path.isdir(gids) else []:
                try:
                    with open(os.path.join(ports, port, "gid_attrs", "types", name)) as f:
                        gid_type = f.read().strip()
                    with open(os.path.join(gids, name)) as f:
                        gid = ipaddress.IPv6Address(f.read().strip())
                except (OSError, ValueError):
                    continue  # unpopulated slots raise EINVAL on real sysfs
                mapped = gid.ipv4_mapped or gid
                if gid_type.lower() == "roce v2" and mapped == want:
                    return dev, port, int(name)
    return None


def main(argv: list[str]) -> int:
    sysfs = "/sys"
    if "--sysfs" in argv:
        i = argv.index("--sysfs")
        sysfs = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    env_file, address = argv
    found = find_gid(sysfs, address)
    if not found:
        print(f"roce_gid: no RoCE v2 GID for {address} under {sysfs}/class/infiniband", file=sys.stderr)
        return 1
    dev, port, index = found
    os.makedirs(os.path.dirname(env_file), exist_ok=True)
    tmp = env_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"NCCL_IB_GID_INDEX={index}\nNCCL_IB_HCA={dev}:{port}\n")
    os.replace(tmp, env_file)
    print(f"roce_gid: {address} is {dev} port {port} GID index {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
