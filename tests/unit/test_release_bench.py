"""The release bench (deploys/service/bench.py): the image's own `vllm bench serve` once per level, run by a real
shell against a stand-in podman that writes the result file the real one writes; its figures read back; the
regressions a switch fails on."""

from __future__ import annotations

import json
import subprocess

import pytest

from deploys.schema import NodeConfig
from deploys.service import bench
from deploys.service.unit import model_path_in_container
from tests.unit.profiles import profile


def config(**keys) -> NodeConfig:
    return NodeConfig.model_validate({**profile("gb10_dspark"), "node_rank": 0, "fabric_address": "198.51.100.20",
                                      "tensor_parallel_size": 1, "release_bench": True, **keys})


def result(level: int, tok_s: float, ttft_p95: float, failed: int = 0) -> dict:
    """A `vllm bench serve --save-result` file's fields the bench reads (vLLM 0.21's names)."""
    return {"max_concurrency": level, "output_throughput": tok_s, "p50_ttft_ms": ttft_p95 / 2, "p95_ttft_ms": ttft_p95,
            "p50_tpot_ms": 9.5, "p95_tpot_ms": 12.25, "completed": 32 - failed, "failed": failed,
            "mean_ttft_ms": 1.0, "request_throughput": 3.0}


STANDIN_PODMAN = r'''#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["PODMAN_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
out = next(a.split(":")[0] for a in args if a.endswith(":/run/inference-nodes-out"))
level = int(args[args.index("--max-concurrency") + 1])
if level in json.loads(os.environ.get("FAIL_AT", "[]")):
    print("RuntimeError: the server went away", file=sys.stderr)
    sys.exit(1)
with open(os.path.join(out, args[args.index("--result-filename") + 1]), "w") as f:
    json.dump(json.loads(os.environ["RESULTS"])[str(level)], f, indent=2)
'''


@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", str(tmp_path / "results"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "podman").write_text(STANDIN_PODMAN)
    (tmp_path / "bin" / "podman").chmod(0o755)

    def run(command: str, results: dict, fail_at=()) -> subprocess.CompletedProcess:
        env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PODMAN_LOG": str(tmp_path / "podman.log"),
               "RESULTS": json.dumps(results), "FAIL_AT": json.dumps(list(fail_at))}
        return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60)
    return run, tmp_path


def test_each_level_runs_the_images_own_bench_against_loopback_and_its_figures_come_back(shell):
    run, tmp = shell
    cfg = config(release_bench_concurrency=[8, 1], release_bench_prompts=16)
    proc = run(bench.bench_command(cfg, "deepseek-v4-flash"), {"1": result(1, 72.3, 230.0), "8": result(8, 343.0, 800.0)})
    assert proc.returncode == 0, proc.stderr
    levels = bench.parse_bench(proc.stdout)
    assert [n["concurrency"] for n in levels] == [1, 8]  # (sorted by the schema)
    assert levels[0] == {"concurrency": 1, "output_tok_s": 72.3, "ttft_p50_ms": 115.0, "ttft_p95_ms": 230.0,
                         "tpot_p50_ms": 9.5, "tpot_p95_ms": 12.25, "completed": 32, "failed": 0}
    calls = [json.loads(line) for line in (tmp / "podman.log").read_text().splitlines()]
    assert len(calls) == 2
    argv = calls[0]
    assert argv[:2] == ["run", "--rm"] and cfg.image_ref in argv and "--pull=never" in argv
    assert argv[argv.index(cfg.image_ref) + 1:][:5] == ["-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend"]
    assert argv[argv.index("--base-url") + 1] == f"http://127.0.0.1:{cfg.engine_port}"
    assert argv[argv.index("--model") + 1] == "deepseek-v4-flash" and argv[argv.index("--num-prompts") + 1] == "16"
    assert f"{cfg.model_dir}:{cfg.model_mount}:ro" in argv and "--ignore-eos" in argv  # (the service's own mount)
    assert argv[argv.index("--tokenizer") + 1] == model_path_in_container(cfg)


def test_a_level_that_fails_fails_the_bench_with_its_words(shell):
    run, _ = shell
    proc = run(bench.bench_command(config(), "m"), {"1": result(1, 72.3, 230.0), "8": result(8, 343.0, 800.0)},
               fail_at=[8])
    assert proc.returncode != 0
    assert "vllm bench serve at concurrency 8 failed" in proc.stderr and "the server went away" in proc.stderr
    assert len(bench.parse_bench(proc.stdout)) == 1  # (the switch fails: fewer levels than asked)


BEFORE = [{"concurrency": 1, "output_tok_s": 100.0, "ttft_p95_ms": 200.0, "failed": 0, "completed": 32},
          {"concurrency": 8, "output_tok_s": 600.0, "ttft_p95_ms": 400.0, "failed": 0, "completed": 32}]


def level(c, tok_s, ttft, failed=0):
    return {"concurrency": c, "output_tok_s": tok_s, "ttft_p95_ms": ttft, "failed": failed, "completed": 32 - failed}


@pytest.mark.parametrize("now, before, found", [
    ([level(1, 95.0, 210.0), level(8, 560.0, 470.0)], BEFORE, []),                    # within 10 % / 20 %
    ([level(1, 100.0, 200.0), level(8, 300.0, 400.0)], BEFORE, ["concurrency 8: output 300 tok/s, 50 % below"]),
    ([level(1, 100.0, 300.0), level(8, 600.0, 400.0)], BEFORE, ["concurrency 1: TTFT p95 300 ms, 50 % above"]),
    ([level(1, 100.0, 200.0, failed=2)], [], ["concurrency 1: 2 of 32 requests failed"]),   # failures: always
    ([level(1, 10.0, 2000.0)], [], []),                                                # nothing to compare with
    ([level(4, 10.0, 2000.0)], BEFORE, []),                                            # a level not benched before
])
def test_a_regression_is_named_with_its_figures_and_threshold(now, before, found):
    got = bench.regressions(now, before, config())
    assert len(got) == len(found) and all(g.startswith(f) for g, f in zip(got, found)), got


def test_the_thresholds_are_the_inventorys():
    now = [level(1, 85.0, 200.0)]
    assert bench.regressions(now, BEFORE, config())  # 15 % below: more than the default 10 %
    assert not bench.regressions(now, BEFORE, config(release_bench_max_tok_s_drop_pct=20))
