"""A release's performance record: after a switch's serving gate passes on a head (`release_bench`), a short fixed
benchmark with the image's own `vllm bench serve` against vLLM on loopback, one run per concurrency level; its
figures are kept with the release (the head's gate record, and so the last good release's copy), and compared with
the last good release's: a regression beyond the typed thresholds fails the switch like a failed gate."""

from __future__ import annotations

import json
import shlex

from deploys.schema import NodeConfig
from deploys.serving_gate import engine_url
from deploys.service.unit import model_path_in_container

RESULTS = "/var/lib/inference-nodes/bench"  # each level's result file of the last bench (root only)


def bench_command(cfg: NodeConfig, model: str) -> str:
    """Shell, on a head: `vllm bench serve` in the pinned image, once per level of `release_bench_concurrency`
    (random prompts of the profile's lengths, `ignore_eos`, seed 0, against vLLM itself on loopback, the
    tokenizer read from the live snapshot, mounted as the service mounts it: an `hf_cache` snapshot's files are
    links into its blobs), each result printed on one line after `##bench `."""
    out = f"{RESULTS}/{cfg.container_name}"
    runs = []
    for level in cfg.release_bench_concurrency:
        argv = ["timeout", str(cfg.release_bench_timeout_s), "podman", "run", "--rm", "--pull=never", "--network=host",
                "--cap-drop=all", "--security-opt=no-new-privileges", f"--entrypoint={cfg.vllm_python}",
                "-v", f"{cfg.model_dir}:{cfg.model_mount}:ro", "-v", f"{out}:/run/inference-nodes-out",
                cfg.image_ref, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai",
                "--base-url", engine_url(cfg), "--endpoint", "/v1/completions", "--model", model,
                "--tokenizer", model_path_in_container(cfg), "--dataset-name", "random",
                "--random-input-len", str(cfg.release_bench_input_len),
                "--random-output-len", str(cfg.release_bench_output_len), "--ignore-eos",
                "--num-prompts", str(cfg.release_bench_prompts), "--max-concurrency", str(level),
                "--num-warmups", str(level),  # (a release's first requests may compile: not what it serves at)
                "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50,95", "--seed", "0", "--disable-tqdm",
                "--save-result", "--result-dir", "/run/inference-nodes-out", "--result-filename", f"c{level}.json"]
        runs.append(f"{shlex.join(argv)} > {out}/c{level}.log 2>&1 || {{ echo 'vllm bench serve at concurrency "
                    f"{level} failed:' >&2; tail -5 {out}/c{level}.log >&2; exit 1; }}; "
                    f"printf '##bench '; tr -d '\\n' < {out}/c{level}.json; echo")
    return f"umask 077 && rm -rf {out} && mkdir -p {out} && " + " && ".join(runs)


def parse_bench(stdout: str) -> list[dict]:
    """Each level's figures from ``bench_command``'s output: concurrency, output tok/s, TTFT and TPOT p50/p95 (ms),
    requests completed and failed."""
    levels = []
    for line in stdout.splitlines():
        if not line.startswith("##bench "):
            continue
        result = json.loads(line[len("##bench "):])
        levels.append({"concurrency": result.get("max_concurrency"),
                       "output_tok_s": round(float(result["output_throughput"]), 2),
                       **{f"{m}_{p}_ms": round(float(result[f"{p}_{m}_ms"]), 2)
                          for m in ("ttft", "tpot") for p in ("p50", "p95")},
                       "completed": int(result.get("completed", 0)), "failed": int(result.get("failed", 0))})
    return levels


def regressions(now: list[dict], before: list[dict], cfg: NodeConfig) -> list[str]:
    """What the release just benched does worse than the last good one (``before``: its figures, [] when it has
    none), beyond `release_bench_max_tok_s_drop_pct` and `release_bench_max_ttft_rise_pct`, at each level both
    ran; and any failed request, which is a regression whatever came before."""
    out = [f"concurrency {n['concurrency']}: {n['failed']} of {n['failed'] + n['completed']} requests failed"
           for n in now if n["failed"]]
    was = {b.get("concurrency"): b for b in before if isinstance(b, dict)}
    for n in now:
        b = was.get(n["concurrency"])
        if not b:
            continue
        if b.get("output_tok_s") and (drop := 100 * (1 - n["output_tok_s"] / b["output_tok_s"])) \
                > cfg.release_bench_max_tok_s_drop_pct:
            out.append(f"concurrency {n['concurrency']}: output {n['output_tok_s']:g} tok/s, {drop:.0f} % below the "
                       f"last good release's {b['output_tok_s']:g} (release_bench_max_tok_s_drop_pct="
                       f"{cfg.release_bench_max_tok_s_drop_pct:g})")
        if b.get("ttft_p95_ms") and (rise := 100 * (n["ttft_p95_ms"] / b["ttft_p95_ms"] - 1)) \
                > cfg.release_bench_max_ttft_rise_pct:
            out.append(f"concurrency {n['concurrency']}: TTFT p95 {n['ttft_p95_ms']:g} ms, {rise:.0f} % above the "
                       f"last good release's {b['ttft_p95_ms']:g} (release_bench_max_ttft_rise_pct="
                       f"{cfg.release_bench_max_ttft_rise_pct:g})")
    return out


def figures_told(levels: list[dict]) -> str:
    """One line: tok/s and TTFT p95 per level."""
    return ", ".join(f"c={n['concurrency']}: {n['output_tok_s']:g} tok/s, TTFT p95 {n['ttft_p95_ms']:g} ms"
                     for n in levels)
