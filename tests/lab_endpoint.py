"""Profile A's endpoint files (inventories/group_data/rtx_pro_6000_pair.py) are control-node secrets a lab makes once
with `python -m deploys.endpoint_ca`. A test tier that reads inventories/lab.py (the unit tier; the node tier's
Quadlet generator checks) makes its own, outside the repository, for its process alone: each tier runs in a process
of its own (tests/unit_tier.py, the Makefile), so each calls this from its conftest."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def make_lab_endpoint_dir() -> str:
    """A lab CA, the endpoint's certificate and two client keys in a private temporary folder, named by
    INFERENCE_NODES_ENDPOINT_DIR for this process and its children; removed when the process ends."""
    from deploys.endpoint_ca import add_clients, endpoint_certificate

    path = tempfile.mkdtemp(prefix="inference-nodes-endpoint-")
    endpoint_certificate(path, "192.0.2.10", ["compute.home.arpa"])
    add_clients(f"{path}/clients", ["workstation", "prometheus"])
    os.environ["INFERENCE_NODES_ENDPOINT_DIR"] = path
    atexit.register(shutil.rmtree, path, True)
    return path
