"""Long-context exact retrieval against each cluster's head (seed 004's gate): a prompt of at least
`gate_long_context_tokens` tokens hides a fresh key that the answer must return exactly, none of it served
from the prefix cache (files/serving_gate/needle.py). Skipped where the profile leaves the key unset.

Runs on the node (the API stays on loopback): `pytest tests/audit -m long_context` (or `-m drained`: a prompt this
long takes the head for a while, so it needs a drained node).
"""

from __future__ import annotations

import json
import shlex

import pytest

from deploys.service.unit import served_model_name
from deploys.serving_gate import GATE_FILES, engine_url, node_script

pytestmark = [pytest.mark.long_context, pytest.mark.drained]


def needle_script(url: str, model: str, tokens: int, *extra: str) -> str:
    """A shell script for the node: needle.py and the serving gate it imports into a private temporary
    directory, then one retrieval request against the head's API."""
    run = f"python3 \"$d/needle.py\" {shlex.quote(url)} {shlex.quote(model)} {int(tokens)} {shlex.join(extra)}\n"
    return node_script(run, GATE_FILES + ("needle.py",))


def verdict_of(stdout: str) -> dict | None:
    verdicts = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return verdicts[-1] if verdicts else None


def test_long_context_retrieval(serving_node, head_only):
    node = serving_node
    tokens = node.cfg.gate_long_context_tokens
    if tokens is None:
        pytest.skip(f"{node.name}: gate_long_context_tokens is unset")
    url = engine_url(node.cfg)
    result = node.host.run(needle_script(url, served_model_name(node.cfg), tokens))
    verdict = verdict_of(result.stdout)
    assert verdict and verdict["ok"], f"{node.name}: long_context: " + (
        verdict["detail"] if verdict else result.stderr.strip()[-2000:])
