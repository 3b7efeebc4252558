#!/usr/bin/env python3
"""Long-context exact retrieval (seed 004's gate): a prompt of at least N tokens hides a fresh key, and the
answer must return it exactly, computed from scratch (`usage.prompt_tokens_details.cached_tokens` 0).
Stdlib only; runs on the node (the API stays on loopback) or anywhere that can reach the URL.

    needle.py BASE_URL MODEL_NAME TOKENS [--seed N]   -> one JSON object: {"check", "ok", "detail", ...}

The prompt: a system message that starts with a fresh nonce (so no prefix, not even the chat template's
first block, is shared with any earlier request and the prefix cache has nothing to serve), then a user
message of TOKENS filler words with `KEY=<key>.` at a random position, then the question. Each filler word
is one common lowercase word, at least one token in any tokenizer, so the prompt has at least TOKENS tokens;
the gate checks that from `usage.prompt_tokens` (the server's own count), never from its own estimate.
The key is KEY_LENGTH distinct letters of KEY_ALPHABET, none of which occurs anywhere else in the prompt
(filler and nonce are lower case, the marker and the fixed sentences use other capitals). Exit status 0 only when the answer contains the key, prompt_tokens >= TOKENS and nothing came
from the prefix cache: `usage.prompt_tokens_details.cached_tokens` is 0 where the server reports it (vLLM
does only with --enable-prompt-tokens-details, and then leaves it out when it is 0), and vLLM's own
prefix-cache hit counter (/metrics) did not move during the request; a server that shows neither fails.
`--seed N` makes the key, nonce and filler reproducible: running it twice shows the second run served from
the prefix cache, and failing.

The format is plain data here (build_messages, FILLER_WORDS, ...) so that the sandbox's known-answer model
(tests/sandbox/tiny_model.py) is trained on exactly what the gate sends.
"""

import json
import os
import random
import secrets
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving_gate import metric_samples  # noqa: E402 - the gate's /metrics reader, beside this file

KEY_ALPHABET = "BCDFGJNPQSVXZ"  # capitals that no other word of the prompt contains (filler is lower case)
KEY_LENGTH = 6
MARKER = "KEY="
QUESTION = "What is the value of KEY? Reply with the value only."
SYSTEM = "You are a helpful assistant. Read the whole text before you answer."
# common words, lower case, none containing an upper-case letter (so never part of the key)
FILLER_WORDS = (
    "the of and to in is was for on that with as by at from his her an were are which this be or had not "
    "but have one their they all has been new more also first other its can after two who would some into "
    "time over most only there may many any such year made these than about when where then them each our "
    "city river house world water light field stone green small large early later north south east west"
).split()
MAX_TOKENS = 16  # the answer is a few tokens; a model that rambles is cut off and judged on what it said
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")  # tokens served from the cache


def fresh_key(rng=None) -> str:
    """KEY_LENGTH distinct letters of KEY_ALPHABET (distinct, so each letter points at one place)."""
    rng = rng or secrets.SystemRandom()
    return "".join(rng.sample(KEY_ALPHABET, KEY_LENGTH))


def fresh_nonce(rng=None) -> str:
    rng = rng or secrets.SystemRandom()
    return "".join(rng.choice("0123456789abcdef") for _ in range(16))


def build_messages(key: str, nonce: str, words: int, position: float, rng) -> list[dict]:
    """The request's messages: `words` filler words drawn by `rng`, the key after a `position` (0..1) share
    of them."""
    filler = [rng.choice(FILLER_WORDS) for _ in range(words)]
    at = min(words, int(position * words))
    text = " ".join(filler[:at] + [f"{MARKER}{key}."] + filler[at:])
    return [{"role": "system", "content": f"{nonce} {SYSTEM}"},
            {"role": "user", "content": f"{text}\n{QUESTION}"}]


def call(base, path, body, timeout):
    req = urllib.request.Request(base.rstrip("/") + path, method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode("utf-8", "replace"))


def prefix_hits(base):
    """vLLM's prefix-cache hit counter (tokens), or None where the server has none."""
    try:
        samples = metric_samples(base)
    except Exception:  # noqa: BLE001 - no /metrics: the verdict then rests on cached_tokens alone
        return None
    return next((samples[name] for name in PREFIX_HITS if name in samples), None)


def run_check(base: str, model: str, tokens: int, seed=None, timeout: float = 3600.0) -> dict:
    """One retrieval request with a fresh key and nonce (reproducible ones for a seed); the verdict as
    {"check", "ok", "detail", ...}."""
    rng = secrets.SystemRandom() if seed is None else random.Random(seed)
    key, nonce = fresh_key(rng), fresh_nonce(rng)
    messages = build_messages(key, nonce, tokens, rng.random(), rng)
    hits_before = prefix_hits(base)
    t0 = time.monotonic()
    try:
        reply = call(base, "/v1/chat/completions", {"model": model, "messages": messages, "temperature": 0,
                                                    "max_tokens": MAX_TOKENS}, timeout)
    except Exception as e:  # noqa: BLE001 - the verdict names what went wrong
        return {"check": "long_context", "ok": False, "detail": f"request failed: {e}"}
    seconds = round(time.monotonic() - t0, 2)
    hits_after = prefix_hits(base)
    hits = None if hits_before is None or hits_after is None else hits_after - hits_before
    usage = reply.get("usage") or {}
    answer = ((reply.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    prompt_tokens = usage.get("prompt_tokens")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    problems = []
    if key not in answer:
        problems.append(f"answer {answer[:80]!r} lacks the key {key}")
    if not isinstance(prompt_tokens, int) or prompt_tokens < tokens:
        problems.append(f"prompt_tokens {prompt_tokens} < {tokens}")
    if cached:
        problems.append(f"cached_tokens {cached}: the prefix cache served part of the prompt")
    if hits:
        problems.append(f"prefix-cache hits rose by {hits:g} tokens during the request")
    if cached is None and hits is None:
        problems.append("no way to see the prefix cache: neither usage.prompt_tokens_details "
                        "(vLLM: --enable-prompt-tokens-details) nor a prefix-cache hit counter in /metrics")
    detail = "; ".join(problems) or f"key {key} returned exactly"
    return {"check": "long_context", "ok": not problems, "detail": detail, "prompt_tokens": prompt_tokens,
            "cached_tokens": cached, "prefix_cache_hits": hits, "seconds": seconds}


def main(argv) -> int:
    seed = None
    if "--seed" in argv:
        i = argv.index("--seed")
        seed, argv = int(argv[i + 1]), argv[:i] + argv[i + 2:]
    base, model, tokens = argv
    result = run_check(base, model, int(tokens), seed)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
