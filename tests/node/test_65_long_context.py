"""Long-context exact retrieval (seed 004's gate) against the real vLLM on the B cluster (sandbox-b0 head,
sandbox-b1 worker, one TP=2 job): the known-answer model returns a fresh key hidden in ~1,600 tokens, none of
them from the prefix cache; the same prompt sent again is served from the cache, and the gate says so."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.audit.test_long_context import needle_script, verdict_of
from tests.node.conftest import INVENTORY, on_node, pyinfra, wait_serving

pytestmark = pytest.mark.pair  # the node tier's subject (`make test-fast SUBJECT=pair`)

HEAD, WORKER = "sandbox-b0", "sandbox-b1"
URL, MODEL, TOKENS = "http://127.0.0.1:8102", "deepseek-v4-flash-0731", 1536
AUDIT = [sys.executable, "-m", "pytest", "-q", "-rf", "tests/audit", "--inventory", INVENTORY, "-m", "long_context"]


def test_b_converges_and_serves(sandbox):
    pyinfra(INVENTORY, "deploys/all.py", "--limit", "gb10_dspark")
    wait_serving([WORKER, HEAD])


def test_the_long_context_audit_passes_on_the_head_and_skips_where_unset(sandbox):
    proc = subprocess.run([*AUDIT, "--limit", HEAD, "--limit", "sandbox-a"], capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0 and "1 passed, 1 skipped" in proc.stdout, proc.stdout[-3000:]


def test_a_repeated_prompt_comes_from_the_prefix_cache_and_fails(sandbox):
    seed = str(time.time_ns())  # reproducible within this test, new to this server
    first = on_node(HEAD, needle_script(URL, MODEL, TOKENS, "--seed", seed))
    fresh = verdict_of(first.stdout)
    assert fresh and fresh["ok"] and fresh["prompt_tokens"] >= TOKENS, first.stdout + first.stderr
    again = on_node(HEAD, needle_script(URL, MODEL, TOKENS, "--seed", seed))
    repeat = verdict_of(again.stdout)
    assert again.returncode == 1 and repeat and not repeat["ok"], again.stdout + again.stderr
    assert repeat["cached_tokens"] and repeat["cached_tokens"] > 0, repeat  # vLLM reports it (the profile's flag)
    assert "the prefix cache served part of the prompt" in repeat["detail"], repeat
    assert "lacks the key" not in repeat["detail"], repeat  # the model still answered; only the cache fails it
