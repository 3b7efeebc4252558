#!/usr/bin/env python3
"""The sandbox's real vLLM (CPU build): seconds from process start to /health answering, for deployment A's stand-in
command line (TP=2 in one node, the tiny known-answer model), with vLLM's default compilation and with `-O0`
(no torch.compile: vLLM's documented fastest-start level), each with an empty compile cache (a first start) and
again with the cache it left (a restart); the serving gate runs against each first start. Runs the image's rootfs in a throwaway nspawn on this machine, outside
any node (the same binaries and model as a node's container; nothing else running). Not a test.

    python bench/vllm_start.py [--runs N] [--levels default,O0]

Needs `make demo` or `make test` to have built the image and the tiny model once ($SANDBOX_DIR/cache). Prints a
table and ends with one line for automated checks:

    vllm_start: default_first_s=X default_restart_s=Y O0_first_s=Z O0_restart_s=W
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

CACHE = os.path.join(os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox"), "cache")
# tests/sandbox/vllm_image.sh's ENV and A's stand-in arguments (inventories/sandbox.py, vllm_serve_ds4_flash.sh)
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1",
       "VLLM_CACHE_ROOT": "/cache/vllm"}
ARGS = ["serve", "/model", "--host", "127.0.0.1", "--served-model-name", "grandpa", "--tensor-parallel-size", "2",
        "--max-model-len", "2048", "--max-num-seqs", "2", "--max-num-batched-tokens", "2048",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--structured-outputs-config.backend", "xgrammar",
        "--structured-outputs-config.disable_any_whitespace", "true"]
LEVELS = {"default": [], "O0": ["-O0"]}
GATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "files/serving_gate/serving_gate.py")


def built(pattern: str) -> str:
    found = sorted(glob.glob(os.path.join(CACHE, pattern)))
    if not found:
        sys.exit(f"vllm_start: no {pattern} under {CACHE}: run `make demo` once")
    return found[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gate(port: int) -> str:
    """The serving gate (files/serving_gate/) against the started vLLM: ``ok/checks`` and the failed checks' names
    (the tiny model answers its dialogues under greedy decoding; another compilation must not change an answer)."""
    import json

    out = subprocess.run([sys.executable, GATE, f"http://127.0.0.1:{port}", "grandpa"], capture_output=True,
                         text=True, timeout=600).stdout
    checks = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    bad = [c.get("check", "?") for c in checks if not c.get("ok")]
    return f"{len(checks) - len(bad)}/{len(checks)}" + (f" (failed: {', '.join(bad)})" if bad else "")


def start_to_health(rootfs: str, model: str, cache: str, extra: list[str], timeout: float = 900,
                    gated: bool = False) -> tuple[float, str]:
    port = free_port()
    env = [f"--setenv={k}={v}" for k, v in ENV.items()]
    cmd = ["systemd-nspawn", "-q", "--register=no", "--keep-unit", "-D", rootfs, "--volatile=overlay",
           f"--bind-ro={model}:/model", f"--bind={cache}:/cache", "--tmpfs=/tmp", *env,
           "/opt/vllm/bin/vllm", *ARGS, "--port", str(port), *extra]
    log = tempfile.TemporaryFile()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                log.seek(0)
                sys.exit(f"vllm_start: vLLM exited ({proc.returncode}):\n{log.read().decode()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        took = time.monotonic() - t0
                        return took, gate(port) if gated else ""
            except OSError:
                pass
            time.sleep(0.5)
        sys.exit(f"vllm_start: no /health within {timeout:.0f} s")
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="first start + restart pairs per level (default 2)")
    parser.add_argument("--levels", default="default,O0")
    args = parser.parse_args(argv)
    rootfs, model = built("vllm-rootfs-*"), os.path.join(built("tiny-models-*"), "good")
    results: dict[str, dict[str, list[float]]] = {}
    levels = args.levels.split(",")
    for _ in range(args.runs):
        for level in levels:  # interleaved: a drift of this machine's load falls on both alike
            cache = tempfile.mkdtemp(prefix="vllm-start-cache-")
            try:
                first, passed = start_to_health(rootfs, model, cache, LEVELS[level], gated=True)
                restart, _ = start_to_health(rootfs, model, cache, LEVELS[level])
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            results.setdefault(level, {"first": [], "restart": [], "gate": []})
            results[level]["first"].append(first)
            results[level]["restart"].append(restart)
            results[level]["gate"].append(passed)
            print(f"  {level}: first start {first:.1f} s (serving gate {passed}), restart {restart:.1f} s", flush=True)
    print(f"\nvLLM {os.path.basename(rootfs)} on {os.cpu_count()} cores, A's stand-in command line (TP=2), "
          f"median of {args.runs}:\n")
    print("| compilation | first start to /health | restart to /health | serving gate checks passed |")
    print("|---|---|---|---|")
    for level in levels:
        r = results[level]
        print(f"| {level} | {statistics.median(r['first']):.1f} s | {statistics.median(r['restart']):.1f} s | "
              f"{', '.join(r['gate'])} |")
    print("vllm_start: " + " ".join(f"{level}_{kind}_s={statistics.median(results[level][kind]):.1f}"
                                    for level in levels for kind in ("first", "restart")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
