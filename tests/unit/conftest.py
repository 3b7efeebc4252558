"""pyinfra's CLI package monkey-patches the standard library with gevent when first imported (as the real
CLI does at start-up). Import it before any test starts threads (the verifier's readers, local HTTP
servers), or a later first import patches locks that threads already hold."""

import importlib

importlib.import_module("pyinfra_cli")

from tests.lab_endpoint import make_lab_endpoint_dir  # noqa: E402

make_lab_endpoint_dir()
