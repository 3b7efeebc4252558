"""The serving gate against each cluster's head: answers coherently, not just HTTP 200 (health, served
name, Paris, tool call round trip, strict JSON, usage.completion_tokens, the generation counter).

Runs on the node (the API stays on loopback): `pytest tests/audit -m serving`.
"""

import json
import os

import pytest

from deploys.inference_service import served_model_name

GATE = os.path.join(os.path.dirname(__file__), "..", "..", "files", "serving_gate", "serving_gate.py")

pytestmark = pytest.mark.serving


def test_serving_gate(node, head_only):
    with open(GATE) as f:
        script = f.read()
    url = f"http://{node.cfg.api_bind_address}:{node.cfg.api_port}"
    result = node.host.run(f"python3 - {url} '{served_model_name(node.cfg)}' <<'GATE_EOF'\n{script}\nGATE_EOF")
    checks = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    failed = [f"{c['check']}: {c['detail']}" for c in checks if not c["ok"]]
    assert checks and not failed, f"{node.name}: " + "; ".join(failed or [result.stderr.strip()])
