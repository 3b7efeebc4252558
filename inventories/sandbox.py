"""The reference profiles pointed at throwaway sandbox nodes (tests/sandbox/node.sh), for tests and `make demo`.

Same groups, same group_data as inventories/lab.py; group_data/sandbox.py (this file's own group, applied
last) swaps in the local stand-ins. Only inventory data differs from a real lab, never code paths.
"""

import os

_DIR = os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox")


def _node(name: str, port: int, **data):
    return (name, {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": port,
        "ssh_user": "root",
        "ssh_key": f"{_DIR}/ssh/id_ed25519",
        # Insecure, and only because a throwaway node gets a new host key at every build: never in a real inventory.
        "ssh_strict_host_key_checking": "off",
        "ssh_known_hosts_file": "/dev/null",
        "_sudo": False,
        **data,
    })


rtx_pro_6000_pair = [_node("sandbox-a", 2201)]

gb10_dspark = [
    _node("sandbox-b0", 2202, node_rank=0, fabric_address="127.0.1.10"),
    _node("sandbox-b1", 2203, node_rank=1, fabric_address="127.0.1.11"),
]
