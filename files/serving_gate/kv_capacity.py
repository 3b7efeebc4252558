"""Seed 004's KV-capacity gate: the `GPU KV cache size` and `Maximum concurrency` figures of vLLM's startup
log, and what is wrong with them against the profile's minimums (`gate_kv_cache_min_tokens`,
`gate_kv_min_concurrency`). Stdlib only; the audit reads the service's journal since its current start
(deploys/serving_gate.py startup_log_command) and judges it on the control side
(tests/audit/test_serving_gate.py), so nothing here runs against the API.
"""

import re

# vLLM's startup log (v1/core/kv_cache_utils.py): "GPU KV cache size: 285,336 tokens" and "Maximum
# concurrency for 262,144 tokens per request: 1.09x" (it says GPU on the CPU build too).
KV_SIZE = re.compile(r"GPU KV cache size: ([0-9][0-9,]*) tokens")
KV_CONCURRENCY = re.compile(r"Maximum concurrency for ([0-9][0-9,]*) tokens per request: ([0-9]+(?:\.[0-9]+)?)x")


def kv_capacity(log):
    """The last `GPU KV cache size` and `Maximum concurrency` figures in a startup log:
    {"tokens": N, "request_tokens": M, "concurrency": X}, a missing line's values None."""
    sizes, concurrency = KV_SIZE.findall(log), KV_CONCURRENCY.findall(log)
    return {"tokens": int(sizes[-1].replace(",", "")) if sizes else None,
            "request_tokens": int(concurrency[-1][0].replace(",", "")) if concurrency else None,
            "concurrency": float(concurrency[-1][1]) if concurrency else None}


def kv_capacity_problems(figures, min_tokens=None, min_concurrency=None):
    """What is wrong with the startup log's KV figures against the profile's minimums (empty: nothing)."""
    problems = []
    if min_tokens is not None:
        if figures["tokens"] is None:
            problems.append("the startup log has no 'GPU KV cache size: N tokens' line (gate_kv_cache_min_tokens "
                            f"{min_tokens:,} cannot be checked)")
        elif figures["tokens"] < min_tokens:
            problems.append(f"GPU KV cache size {figures['tokens']:,} tokens is below gate_kv_cache_min_tokens "
                            f"{min_tokens:,}")
    if min_concurrency is not None:
        if figures["concurrency"] is None:
            problems.append("the startup log has no 'Maximum concurrency for M tokens per request: X' line "
                            f"(gate_kv_min_concurrency {min_concurrency:g} cannot be checked)")
        elif figures["concurrency"] < min_concurrency:
            problems.append(f"maximum concurrency {figures['concurrency']:g}x for {figures['request_tokens']:,} "
                            f"tokens per request is below gate_kv_min_concurrency {min_concurrency:g}x")
    return problems
