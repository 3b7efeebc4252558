"""The long-context retrieval gate's prompt and verdict (files/serving_gate/needle.py). Against a real vLLM
with the sandbox's known-answer model: tests/node/test_65_long_context.py."""

from __future__ import annotations

import importlib.util
import random
import sys

import pytest

NEEDLE = "files/serving_gate/needle.py"


@pytest.fixture()
def needle():
    spec = importlib.util.spec_from_file_location("needle", NEEDLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.path[:] = [p for p in sys.path if not p.endswith("files/serving_gate")]


def test_the_key_is_hidden_once_among_lower_case_filler(needle):
    rng = random.Random(3)
    key, nonce = needle.fresh_key(rng), needle.fresh_nonce(rng)
    assert len(key) == len(set(key)) == needle.KEY_LENGTH and set(key) <= set(needle.KEY_ALPHABET)
    system, user = needle.build_messages(key, nonce, 500, 0.3, rng)
    assert system["content"].startswith(nonce) and len(nonce) == 16
    text = system["content"] + user["content"]
    assert text.count(key) == 1 and text.count(needle.MARKER) == 1
    rest = text.replace(needle.MARKER + key, "")
    assert not set(needle.KEY_ALPHABET) & set(rest), "no key letter anywhere else"
    words = user["content"].split("\n")[0].split()
    assert len(words) == 501 and words.index(f"{needle.MARKER}{key}.") == 150
    assert all(w in needle.FILLER_WORDS for w in words if needle.MARKER not in w)


def test_fresh_runs_share_no_prefix(needle):
    a = needle.build_messages(needle.fresh_key(), needle.fresh_nonce(), 50, 0.5, random.Random(1))
    b = needle.build_messages(needle.fresh_key(), needle.fresh_nonce(), 50, 0.5, random.Random(1))
    assert a[0]["content"][:16] != b[0]["content"][:16]


def _reply(answer="", prompt_tokens=2000, cached=None):
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 7}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"choices": [{"message": {"content": answer}}], "usage": usage}


@pytest.mark.parametrize("answer, prompt_tokens, cached, hits, problem", [
    ("KEY", 2000, None, [0, 0], None),
    ("KEY", 2000, 0, None, None),
    ("the key is KEY.", 2000, None, [5, 5], None),
    ("KEX", 2000, None, [0, 0], "lacks the key"),
    ("KEY", 1999, None, [0, 0], "prompt_tokens 1999 < 2000"),
    ("KEY", 2000, 1024, [0, 1024], "cached_tokens 1024"),
    ("KEY", 2000, None, [0, 512], "prefix-cache hits rose by 512"),
    ("KEY", 2000, None, None, "no way to see the prefix cache"),
])
def test_the_verdict(needle, monkeypatch, answer, prompt_tokens, cached, hits, problem):
    sent = {}

    def fake_call(base, path, body, timeout):
        key = body["messages"][1]["content"].split(needle.MARKER)[1][:needle.KEY_LENGTH]
        sent.update(body=body, key=key)
        return _reply(answer.replace("KEY", key).replace("KEX", key[:-1]), prompt_tokens, cached)

    counter = iter(hits or [])
    monkeypatch.setattr(needle, "call", fake_call)
    monkeypatch.setattr(needle, "prefix_hits", lambda base: next(counter, None))
    verdict = needle.run_check("http://x", "m", 2000)
    assert sent["body"]["temperature"] == 0 and sent["body"]["max_tokens"] == needle.MAX_TOKENS
    assert verdict["ok"] is (problem is None), verdict
    if problem:
        assert problem in verdict["detail"], verdict


def test_a_seed_repeats_the_prompt(needle, monkeypatch):
    bodies = []
    monkeypatch.setattr(needle, "call", lambda base, path, body, timeout: bodies.append(body) or _reply())
    monkeypatch.setattr(needle, "prefix_hits", lambda base: 0)
    needle.run_check("http://x", "m", 100, seed=7)
    needle.run_check("http://x", "m", 100, seed=7)
    needle.run_check("http://x", "m", 100)
    assert bodies[0] == bodies[1] != bodies[2]


def test_the_schemas_answer_budget_is_the_needles(needle):
    from deploys.schema.node import NEEDLE_ANSWER_TOKENS  # gate_long_context_tokens + it must fit --max-model-len

    assert needle.MAX_TOKENS == NEEDLE_ANSWER_TOKENS
