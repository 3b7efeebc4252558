"""Serving gate keys: seed 004's qualification gates (files/serving_gate/serving_gate.py, run by
tests/audit/test_serving_gate.py; deploys/serving_gate.py turns the keys into the gate's options)."""

from __future__ import annotations

from pydantic import field_validator

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
    release_bench: bool = _key(
        False, description="after a switch's serving gate passes on a head, a short fixed benchmark with the image's own "
        "`vllm bench serve` against loopback (the `release_bench_*` profile); its figures are kept with the release, "
        "and a regression beyond the `release_bench_max_*` thresholds against the last good release's figures fails "
        "the switch like a failed gate (`failed_release_policy`). Off for a plain converge; a rollout turns it on",
    )
    release_bench_concurrency: list[int] = _key(
        [1, 8], description="release bench: the concurrency levels (`--max-concurrency`), each a run of its own",
        min_length=1, max_length=8,
    )
    release_bench_prompts: int = _key(
        32, description="release bench: prompts per concurrency level (`--num-prompts`)", ge=1, le=10_000,
    )
    release_bench_input_len: int = _key(
        512, description="release bench: tokens per random prompt (`--random-input-len`)", ge=1, le=1_048_576,
    )
    release_bench_output_len: int = _key(
        128, description="release bench: tokens generated per request, `ignore_eos` (`--random-output-len`)", ge=1,
        le=1_048_576,
    )
    release_bench_max_tok_s_drop_pct: float = _key(
        10.0, description="release bench: the most output tok/s may drop against the last good release, at any "
        "level, in %", gt=0, le=100,
    )
    release_bench_max_ttft_rise_pct: float = _key(
        20.0, description="release bench: the most TTFT p95 may rise against the last good release, at any level, in %",
        gt=0, le=10_000,
    )
    release_bench_timeout_s: int = _key(
        600, description="release bench: the bound of each level's run (the image's vLLM loading its benchmark "
        "included); past it the switch fails", ge=30, le=7200,
    )

    @field_validator("release_bench_concurrency")
    @classmethod
    def _levels(cls, value: list[int]) -> list[int]:
        if any(c < 1 or c > 1024 for c in value) or len(set(value)) != len(value):
            raise ValueError("concurrency levels are distinct whole numbers from 1 to 1024")
        return sorted(value)
