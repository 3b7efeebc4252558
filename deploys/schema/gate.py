"""Serving gate keys: seed 004's qualification gates (files/serving_gate/serving_gate.py, run by
tests/audit/test_serving_gate.py; deploys/serving_gate.py turns the keys into the gate's options)."""

from __future__ import annotations

from deploys.schema.base import ComponentKeys, _key


class GateKeys(ComponentKeys):
    """The serving gate's qualification checks, each off unless the profile sets it."""

    gate_restart: bool = _key(
        False, description="qualification (`pytest tests/audit -m drained --qualify`, a drained node): restart the service, workers "
        "before the head, wait for /health and rerun the smoke requests",
    )
    gate_concurrency: int = _key(
        0, description="concurrency proof: K simultaneous requests, all scheduled together "
        "(`vllm:num_requests_running` = K, `vllm:num_requests_waiting` = 0 while they run), at most the "
        "`--max-num-seqs` of `vllm_args`; 0 = off", ge=0, le=1024,
    )
    gate_concurrency_tokens: int = _key(
        256, description="concurrency proof: the exact completion length of each request (`max_tokens` with "
        "`ignore_eos`), counted from `usage.completion_tokens`", ge=8, le=1048576,
    )
    gate_min_aggregate_tok_s: float = _key(
        0, description="concurrency proof: the least aggregate decode rate (`usage.completion_tokens` over the "
        "wall time, never stream chunks), tok/s; 0 = report it only", ge=0, le=1e6,
    )
    gate_kv_cache_min_tokens: int | None = _key(
        None, description="the least `GPU KV cache size: N tokens` the service's startup log may report; "
        "unset = not checked", ge=1,
    )
    gate_kv_min_concurrency: float | None = _key(
        None, description="the least `Maximum concurrency for M tokens per request: X` (X) the startup log may "
        "report; unset = not checked", gt=0, le=1e9,
    )
    gate_long_context_tokens: int | None = _key(
        None, description="long-context exact retrieval (`-m long_context`) with a prompt of at least this many "
        "tokens, uncached (files/serving_gate/needle.py; the server needs `--enable-prompt-tokens-details`), with "
        "its 16-token answer within the `--max-model-len` of `vllm_args`; unset = not run", ge=64, le=16_777_216,
    )
