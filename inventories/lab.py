"""The lab: the three reference deployments of ../shared/REFERENCE.md, one group each.

A group is one serving cluster; its profile lives in group_data/<group>.py, per-host values (rank,
fabric address, how to reach it) here. Adding a node is one entry in its group (docs/operations.md, "Add a node").
Addresses are documentation addresses (RFC 5737): replace them with your hosts'.
"""

# A: one host, 2x RTX PRO 6000 Blackwell Max-Q (seed 000)
rtx_pro_6000_pair = [
    ("rtx-pro-a.lab.example", {"ssh_hostname": "192.0.2.10"}),
]

# B: two GB10 nodes, DSpark Graph-8 over RoCE v2 (seed 004). The worker (rank 1) starts before the head.
gb10_dspark = [
    ("gb10-b0.lab.example", {"ssh_hostname": "192.0.2.20", "node_rank": 0, "fabric_address": "198.51.100.20"}),
    ("gb10-b1.lab.example", {"ssh_hostname": "192.0.2.21", "node_rank": 1, "fabric_address": "198.51.100.21"}),
]

# C: two DGX Spark nodes, MTP + prefix caching over RoCE v2 (seed 003)
gb10_mtp = [
    ("spark-c0.lab.example", {"ssh_hostname": "192.0.2.30", "node_rank": 0, "fabric_address": "198.51.100.30"}),
    ("spark-c1.lab.example", {"ssh_hostname": "192.0.2.31", "node_rank": 1, "fabric_address": "198.51.100.31"}),
]

# Each cluster is also a pyinfra group under its cluster_name: `--limit gb10-dspark` selects the cluster's members.
from deploys.inventory import with_cluster_groups  # noqa: E402

with_cluster_groups(globals())
