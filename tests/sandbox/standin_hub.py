"""A stand-in for the Hugging Face hub on 127.0.0.1: model repos served through the routes huggingface_hub
2.4 really calls (tree listing, HEAD/GET resolve with Range, revision info).

Each commit serves either a real model repo read from a directory (every file under it, e.g. the
known-answer model of tests/sandbox/tiny_model.py: config.json, tokenizer files, chat_template.jinja,
shards and index) or, by default, a generated one: a few safetensors shards of a few MB (valid headers),
their real `model.safetensors.index.json`, config.json and README.md. The pinned COMMITS serve the generated
repo unless given a directory; BROKEN_COMMIT (a third commit, for the scrambled model) exists only when
given one. `*.safetensors` are LFS files. A token, when configured, is required as
`Authorization: Bearer <token>`.

    python -m tests.sandbox.standin_hub --port 8802 [--shards 4] [--shard-mb 3] [--token-file F]
                                        [--repo-dir COMMIT=DIR ...]

COMMIT is 40 hex digits, or `pinned` (both COMMITS) or `broken` (BROKEN_COMMIT), e.g.
`--repo-dir pinned=/var/tmp/tiny/good --repo-dir broken=/var/tmp/tiny/scrambled`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

REPO = "deepseek-ai/DeepSeek-V4-Flash-0731"
COMMITS = ("7872f01b1d1fe23eabc4c98b48bffcef5a386062", "9e165c30e2704aec5d9d593cce3eebd58bbef1cb")
BROKEN_COMMIT = "b40c3e5c0ffee0ddba11fa11edbadc0de5ca4b1e"  # the scrambled model's commit (sandbox only)
ALIASES = {"pinned": COMMITS, "broken": (BROKEN_COMMIT,)}


def safetensors_shard(index: int, size: int) -> tuple[bytes, list[str]]:
    """A valid safetensors file of about ``size`` bytes holding two U8 tensors."""
    names = [f"model.layers.{index}.a.weight", f"model.layers.{index}.b.weight"]
    data = random.Random(index).randbytes(size)
    half = size // 2
    header = {names[0]: {"dtype": "U8", "shape": [half], "data_offsets": [0, half]},
              names[1]: {"dtype": "U8", "shape": [size - half], "data_offsets": [half, size]}}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data, names


def make_repo(shards: int = 4, shard_bytes: int = 3 * 1024 * 1024 + 17) -> dict[str, bytes]:
    files = {"config.json": b'{"architectures": ["DeepseekV4ForCausalLM"], "model_type": "stand-in"}\n',
             "README.md": b"# stand-in DeepSeek-V4-Flash-0731 (sandbox)\n"}
    weight_map, total = {}, 0
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        files[name], tensors = safetensors_shard(i, shard_bytes)
        total += shard_bytes
        weight_map.update({t: name for t in tensors})
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    return files


def read_repo(directory: str) -> dict[str, bytes]:
    """Every file under ``directory`` (relative POSIX paths), hidden files and directories left out."""
    files = {}
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if not name.startswith("."):
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, directory).replace(os.sep, "/")] = f.read()
    if not files:
        raise ValueError(f"no files under {directory}")
    return files


def parse_repo_dirs(specs: list[str]) -> dict[str, str]:
    """``COMMIT=DIR`` (COMMIT: 40 hex, ``pinned`` or ``broken``) -> {commit: dir}."""
    out = {}
    for spec in specs:
        key, sep, directory = spec.partition("=")
        if not sep or not directory:
            raise ValueError(f"--repo-dir wants COMMIT=DIR, got {spec!r}")
        commits = ALIASES.get(key) or ((key,) if re.fullmatch(r"[0-9a-f]{40}", key) else None)
        if not commits:
            raise ValueError(f"--repo-dir: {key!r} is neither 40 hex digits nor one of {sorted(ALIASES)}")
        out.update({c: directory for c in commits})
    return out


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    """``repos``: {commit: {path: bytes}}; ``main`` is COMMITS[0] when served, else the first commit."""

    def __init__(self, repos: dict[str, dict[str, bytes]], token: str | None = None):
        self.repos, self.token = repos, token
        self.main = COMMITS[0] if COMMITS[0] in repos else next(iter(repos))
        self.requests: list[str] = []
        self._entries: dict[tuple[str, str], dict] = {}

    @property
    def files(self) -> dict[str, bytes]:
        return self.repos[self.main]

    def commit(self, rev: str) -> str | None:
        commit = self.main if rev == "main" else rev
        return commit if commit in self.repos else None

    @staticmethod
    def is_lfs(path: str) -> bool:
        return path.endswith(".safetensors")

    def entry(self, path: str, commit: str | None = None) -> dict:
        commit = commit or self.main
        if (commit, path) in self._entries:
            return self._entries[commit, path]
        data = self.repos[commit][path]
        e = {"type": "file", "path": path, "size": len(data)}
        if self.is_lfs(path):
            sha = hashlib.sha256(data).hexdigest()
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()
            e["oid"] = git_blob_sha1(pointer)
            e["lfs"] = {"oid": sha, "size": len(data), "pointerSize": len(pointer)}
        else:
            e["oid"] = git_blob_sha1(data)
        self._entries[commit, path] = e
        return e


def handler(hub: Hub):
    rp = re.escape(REPO)

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str]):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, obj, status=200, headers=None):
            self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _error(self, status: int, code: str, headers=None):
            self._json({"error": code}, status, {"X-Error-Code": code, "X-Error-Message": code, **(headers or {})})

        def route(self):
            url = urlsplit(self.path)
            path = unquote(url.path)
            hub.requests.append(f"{self.command} {path}")
            if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                return self._error(401, "GatedRepo" if "/resolve/" in path or "/api/" in path else "Unauthorized")
            if m := re.fullmatch(rf"/api/models/{rp}/revision/([^/]+)", path):
                if not (sha := hub.commit(m[1])):
                    return self._error(404, "RevisionNotFound")
                return self._json({"id": REPO, "sha": sha, "siblings": [{"rfilename": p} for p in sorted(hub.repos[sha])]})
            if m := re.fullmatch(rf"/api/models/{rp}/tree/([^/]+)(/.*)?", path):
                if not (sha := hub.commit(m[1])):
                    return self._error(404, "RevisionNotFound")
                return self._json([hub.entry(p, sha) for p in sorted(hub.repos[sha])])
            if m := re.fullmatch(rf"/{rp}/resolve/([^/]+)/(.+)", path):
                rev, name = m.groups()
                if not (commit := hub.commit(rev)):
                    return self._error(404, "RevisionNotFound")
                files = hub.repos[commit]
                if name not in files:
                    return self._error(404, "EntryNotFound", {"X-Repo-Commit": commit})
                e = hub.entry(name, commit)
                headers = {"X-Repo-Commit": commit, "ETag": f'"{e["oid"]}"', "Accept-Ranges": "bytes"}
                if hub.is_lfs(name):
                    headers["X-Linked-Etag"] = f'"{e["lfs"]["oid"]}"'
                    headers["X-Linked-Size"] = str(e["size"])
                data = files[name]
                start, end, status = 0, len(data) - 1, 200
                if (r := self.headers.get("Range")) and (mm := re.fullmatch(r"bytes=(\d+)-(\d*)", r)):
                    start, end, status = int(mm[1]), int(mm[2]) if mm[2] else end, 206
                    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                return self._send(status, data[start:end + 1], headers)
            if re.fullmatch(r"/api/models/[^/]+/[^/]+(/.*)?", path) or "/resolve/" in path:
                return self._error(404, "RepoNotFound")
            return self._error(404, "NotFound")

        do_GET = do_HEAD = do_POST = route

    return H


def serve(port: int = 0, shards: int = 4, shard_bytes: int = 3 * 1024 * 1024 + 17, token: str | None = None,
          repo_dirs: dict[str, str] | None = None):
    """``repo_dirs``: {commit: directory} served from disk; the pinned COMMITS not in it serve the generated repo."""
    repo_dirs = repo_dirs or {}
    generated = make_repo(shards, shard_bytes) if any(c not in repo_dirs for c in COMMITS) else None
    repos = {c: generated for c in COMMITS if c not in repo_dirs}
    loaded: dict[str, dict[str, bytes]] = {}
    for commit, directory in repo_dirs.items():
        repos[commit] = loaded.setdefault(os.path.abspath(directory), read_repo(directory))
    hub = Hub(repos, token)
    server = ThreadingHTTPServer(("127.0.0.1", port), handler(hub))
    server.hub = hub
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8802)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mb", type=float, default=3)
    ap.add_argument("--token-file")
    ap.add_argument("--repo-dir", action="append", default=[], metavar="COMMIT=DIR",
                    help="serve the files under DIR at COMMIT (40 hex, 'pinned' = both COMMITS, 'broken' = BROKEN_COMMIT)")
    args = ap.parse_args()
    tok = open(args.token_file).read().strip() if args.token_file else None
    try:
        dirs = parse_repo_dirs(args.repo_dir)
    except ValueError as e:
        ap.error(str(e))
    srv = serve(args.port, args.shards, int(args.shard_mb * 1024 * 1024) + 17, tok, dirs)
    served = ", ".join(f"{c[:12]}={dirs.get(c, f'generated ({args.shards} shards)')}" for c in srv.hub.repos)
    print(f"stand-in hub on http://127.0.0.1:{srv.server_address[1]} ({served})", flush=True)
    threading.Event().wait()
