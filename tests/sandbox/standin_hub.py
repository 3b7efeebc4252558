"""A stand-in for the Hugging Face hub on 127.0.0.1: one generated model repo, served through the routes
huggingface_hub 2.4 really calls (tree listing, HEAD/GET resolve with Range, revision info).

The repo is deterministic: a few safetensors shards of a few MB (valid headers), their real
`model.safetensors.index.json`, config.json and README.md, served at every commit the profiles pin.
A token, when configured, is required as `Authorization: Bearer <token>`.

    python -m tests.sandbox.standin_hub --port 8802 [--shards 4] [--shard-mb 3] [--token-file F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

REPO = "deepseek-ai/DeepSeek-V4-Flash-0731"
COMMITS = ("7872f01b1d1fe23eabc4c98b48bffcef5a386062", "9e165c30e2704aec5d9d593cce3eebd58bbef1cb")


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


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    def __init__(self, files: dict[str, bytes], token: str | None = None):
        self.files, self.token = files, token
        self.lfs = {p for p in files if p.endswith(".safetensors")}
        self.requests: list[str] = []

    def entry(self, path: str) -> dict:
        data = self.files[path]
        e = {"type": "file", "path": path, "size": len(data)}
        if path in self.lfs:
            sha = hashlib.sha256(data).hexdigest()
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n".encode()
            e["oid"] = git_blob_sha1(pointer)
            e["lfs"] = {"oid": sha, "size": len(data), "pointerSize": len(pointer)}
        else:
            e["oid"] = git_blob_sha1(data)
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
                if m[1] not in ("main", *COMMITS):
                    return self._error(404, "RevisionNotFound")
                sha = COMMITS[0] if m[1] == "main" else m[1]
                return self._json({"id": REPO, "sha": sha, "siblings": [{"rfilename": p} for p in sorted(hub.files)]})
            if m := re.fullmatch(rf"/api/models/{rp}/tree/([^/]+)(/.*)?", path):
                if m[1] not in ("main", *COMMITS):
                    return self._error(404, "RevisionNotFound")
                return self._json([hub.entry(p) for p in sorted(hub.files)])
            if m := re.fullmatch(rf"/{rp}/resolve/([^/]+)/(.+)", path):
                rev, name = m.groups()
                if rev not in ("main", *COMMITS):
                    return self._error(404, "RevisionNotFound")
                commit = COMMITS[0] if rev == "main" else rev
                if name not in hub.files:
                    return self._error(404, "EntryNotFound", {"X-Repo-Commit": commit})
                e = hub.entry(name)
                headers = {"X-Repo-Commit": commit, "ETag": f'"{e["oid"]}"', "Accept-Ranges": "bytes"}
                if name in hub.lfs:
                    headers["X-Linked-Etag"] = f'"{e["lfs"]["oid"]}"'
                    headers["X-Linked-Size"] = str(e["size"])
                data = hub.files[name]
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


def serve(port: int = 0, shards: int = 4, shard_bytes: int = 3 * 1024 * 1024 + 17, token: str | None = None):
    hub = Hub(make_repo(shards, shard_bytes), token)
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
    args = ap.parse_args()
    tok = open(args.token_file).read().strip() if args.token_file else None
    srv = serve(args.port, args.shards, int(args.shard_mb * 1024 * 1024) + 17, tok)
    print(f"stand-in hub on http://127.0.0.1:{srv.server_address[1]} ({args.shards} shards)", flush=True)
    threading.Event().wait()
