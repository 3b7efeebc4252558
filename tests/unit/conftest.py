"""pyinfra's CLI package monkey-patches the standard library with gevent when first imported (as the real
CLI does at start-up). Import it before any test starts threads (the verifier's readers, local HTTP
servers), or a later first import patches locks that threads already hold."""

import importlib

importlib.import_module("pyinfra_cli")

# Profile A's endpoint files (inventories/group_data/rtx_pro_6000_pair.py) are control-node secrets a lab makes once
# with `python -m deploys.endpoint_ca`; the unit tier makes its own, outside the repository, for this run alone.
import atexit  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

from deploys.endpoint_ca import add_clients, endpoint_certificate  # noqa: E402

_ENDPOINT_DIR = tempfile.mkdtemp(prefix="inference-nodes-endpoint-")
endpoint_certificate(_ENDPOINT_DIR, "192.0.2.10", ["compute.home.arpa"])
add_clients(f"{_ENDPOINT_DIR}/clients", ["workstation", "prometheus"])
os.environ["INFERENCE_NODES_ENDPOINT_DIR"] = _ENDPOINT_DIR
atexit.register(shutil.rmtree, _ENDPOINT_DIR, True)
