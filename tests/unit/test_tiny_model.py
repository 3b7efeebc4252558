"""The sandbox's known-answer model (tests/sandbox/tiny_model.py) and the stand-in hub serving real model
directories. Generating the model needs torch + transformers + tokenizers, which the unit venv lacks: that
test (three generations, ~100 s on 2 cores) runs tiny_model.py with $TINY_MODEL_PYTHON, e.g. the vLLM dev
venv's python, and is skipped without it. The hub tests need only huggingface_hub."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from tests.sandbox.standin_hub import BROKEN_COMMIT, COMMITS, REPO, parse_repo_dirs, serve

TINY = "tests/sandbox/tiny_model.py"


def _model_python() -> str | None:
    py = os.environ.get("TINY_MODEL_PYTHON")
    if py and os.access(py, os.X_OK):
        if subprocess.run([py, "-c", "import torch, transformers, tokenizers"], capture_output=True).returncode == 0:
            return py
    return None


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


@pytest.mark.skipif(_model_python() is None, reason="$TINY_MODEL_PYTHON (torch + transformers + tokenizers) not set")
def test_tiny_model_is_a_real_sharded_qwen2_repo_and_deterministic(tmp_path):
    py = _model_python()
    out = tmp_path / "good"
    proc = subprocess.run([py, TINY, str(out), "--variant", "good", "--seed", "0"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["variant"] == "good" and info["seconds"] < 120

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["max_position_embeddings"] >= 2048
    assert config["hidden_size"] // config["num_attention_heads"] >= 32  # vLLM's CPU attention
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert [p.name for p in shards] == [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    in_shards = {name: p.name for p in shards for name in _header(p) if name != "__metadata__"}
    assert index["weight_map"] == in_shards
    assert index["metadata"]["total_size"] == sum(
        t["data_offsets"][1] - t["data_offsets"][0] for p in shards for k, t in _header(p).items() if k != "__metadata__")
    assert all(t["dtype"] == "BF16" for p in shards for k, t in _header(p).items() if k != "__metadata__")

    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"
    template = (out / "chat_template.jinja").read_text()
    assert "<tool_call>" in template and "<tool_response>" in template and "tools" in template
    added = {t["content"] for t in json.loads((out / "tokenizer.json").read_text())["added_tokens"]}
    assert {"<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"} <= added  # the hermes parser needs them
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == config["eos_token_id"]

    # same seed, same bytes; the scrambled variant: same files and sizes, other weights
    again = subprocess.run([py, TINY, str(tmp_path / "again"), "--variant", "good"], capture_output=True, timeout=300)
    assert again.returncode == 0
    scrambled = subprocess.run([py, TINY, str(tmp_path / "scr"), "--variant", "scrambled"], capture_output=True,
                               text=True, timeout=300)
    assert scrambled.returncode == 0, scrambled.stderr[-3000:]
    for p in sorted(out.iterdir()):
        assert (tmp_path / "again" / p.name).read_bytes() == p.read_bytes(), p.name
        other = tmp_path / "scr" / p.name
        assert other.stat().st_size == p.stat().st_size, p.name
        assert (other.read_bytes() == p.read_bytes()) == (not p.name.endswith(".safetensors")), p.name


def _repo_dir(path: Path, tag: str) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "tag": tag}))
    (path / "tokenizer.json").write_text('{"model": {}}')
    (path / "chat_template.jinja").write_text("{{ messages }}")
    (path / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", 8) + b"{}      " + tag.encode() * 1000)
    (path / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": {}}')
    (path / ".hidden").write_text("not served")
    return path


def test_hub_serves_real_directories_at_the_pinned_and_the_broken_commit(tmp_path):
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    from huggingface_hub import snapshot_download

    from deploys.model.manifest import generate

    good, bad = _repo_dir(tmp_path / "good", "good"), _repo_dir(tmp_path / "bad", "bad")
    srv = serve(repo_dirs=parse_repo_dirs([f"pinned={good}", f"broken={bad}"]))
    endpoint = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        for commit, src in ((COMMITS[0], good), (COMMITS[1], good), (BROKEN_COMMIT, bad), ("main", good)):
            got = Path(snapshot_download(REPO, revision=commit, cache_dir=str(tmp_path / "cache"), endpoint=endpoint))
            want = sorted(p.name for p in src.iterdir() if not p.name.startswith("."))
            assert sorted(p.name for p in got.iterdir()) == want
            assert all((got / n).read_bytes() == (src / n).read_bytes() for n in want)
        manifest = {e["path"]: e for e in generate(REPO, BROKEN_COMMIT, endpoint)["files"]}
        assert "sha256" in manifest["model-00001-of-00001.safetensors"] and "git_sha1" in manifest["tokenizer.json"]
    finally:
        srv.shutdown()


def test_hub_without_directories_still_serves_the_generated_repo_and_not_the_broken_commit():
    srv = serve(shards=2, shard_bytes=1024 + 3)
    try:
        assert set(srv.hub.repos) == set(COMMITS)
        assert sorted(srv.hub.files) == ["README.md", "config.json", "model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    finally:
        srv.shutdown()


@pytest.mark.parametrize("spec", ["pinned", "abc=/x", "=/x", "broken="])
def test_hub_refuses_a_bad_repo_dir(spec):
    with pytest.raises(ValueError):
        parse_repo_dirs([spec])
