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
READY_TIMEOUT_S = int(os.environ.get("SERVING_READY_TIMEOUT_S", "900"))


def test_serving_gate(node, head_only):
    with open(GATE) as f:
        script = f.read()
    url = f"http://{node.cfg.api_bind_address}:{node.cfg.api_port}"
    # a real vLLM loads and compiles before it answers: wait for /health (the start timeout bounds it)
    wait = (f"python3 -c \"import time, urllib.request as u\nfor _ in range({READY_TIMEOUT_S}):\n try:\n"
            f"  u.urlopen('{url}/health', timeout=5); break\n except Exception: time.sleep(1)\""
            " 2>/dev/null")
    node.host.run(wait)
    result = node.host.run(f"python3 - {url} '{served_model_name(node.cfg)}' <<'GATE_EOF'\n{script}\nGATE_EOF")
    checks = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    failed = [f"{c['check']}: {c['detail']}" for c in checks if not c["ok"]]
    assert checks and not failed, f"{node.name}: " + "; ".join(failed or [result.stderr.strip()])
