"""The NCCL runtime the serving process really loads, read inside the pinned image, and the known-bad list.

Run with the image's Python (`podman exec NAME python3 - < nccl_runtime.py`, or with a path argument for a
given library): it imports torch and vLLM's own `find_nccl_library()` as the server does, loads that library
(after `import torch` a pip wheel's NCCL is already mapped and wins over a .deb's of the same soname), asks
it `ncclGetVersion` and prints one JSON line: ``{"version": "2.29.3", "library": "/path/libnccl.so.2"}``,
or ``{"cuda": null}`` for a build without CUDA that names no NCCL (nothing to check), or ``{"error": "..."}`` (exit 1).

`torch.cuda.nccl.version()` is not used: it is the version torch was compiled against, not the one loaded.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys


def known_bad_path() -> str:
    """The data file beside this module (a function: run as `python -c`, the module has no __file__)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl-known-bad.json")


def version_string(code: int) -> str:
    """NCCL's integer version (>= 2.9: major*10000 + minor*100 + patch; before: major*1000 + minor*100 + patch)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def library_version(path: str) -> dict:
    lib = ctypes.CDLL(path)
    code = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(code)) != 0:
        raise RuntimeError(f"ncclGetVersion failed in {path}")
    return {"version": version_string(code.value), "library": _loaded_file(path)}


def _loaded_file(path: str) -> str:
    """The file ``ctypes.CDLL(path)`` loaded: ``path`` itself where it names a file, else the one the process
    has mapped under that soname (which libnccl.so.2 won: after `import torch`, a pip wheel's)."""
    if os.sep in path:
        return os.path.realpath(path)
    return _mapped(path) or path


def _mapped(name: str) -> str | None:
    try:
        with open("/proc/self/maps") as f:
            return mapped_file(name, f)
    except OSError:
        return None


def mapped_file(name: str, maps) -> str | None:
    """The file a /proc/PID/maps listing maps under the library name ``name`` (first by path if several)."""
    paths = {p for line in maps if len(fields := line.split()) >= 6 and (p := fields[5]).startswith("/")
             and os.path.basename(p) == name}
    return sorted(paths)[0] if paths else None


def serving_process_nccl() -> dict:
    """What vLLM's pynccl would load: `VLLM_NCCL_SO_PATH` when the container sets it, else libnccl.so.2 for a
    CUDA torch (already mapped by `import torch` where a pip wheel brings it)."""
    __import__("torch")  # first, as in the server: torch's own NCCL is mapped before vLLM looks

    try:
        from vllm.utils.nccl import find_nccl_library
    except ImportError:  # older vLLM
        from vllm.utils import find_nccl_library
    try:
        library = find_nccl_library()
    except ValueError:  # neither CUDA nor ROCm, and no VLLM_NCCL_SO_PATH: the server loads no NCCL
        return {"cuda": None}
    return library_version(library)


def known_bad(version: str, arch: str, multi_node: bool, path: str | None = None) -> dict | None:
    """The known-bad entry (data, with its source) that applies to this version, CPU and topology, if any."""
    with open(path or known_bad_path()) as f:
        entries = json.load(f)["known_bad"]
    for entry in entries:
        if (version in entry["versions"] and arch in entry["arch"]
                and (multi_node or not entry.get("multi_node_only", False))):
            return entry
    return None


if __name__ == "__main__":
    try:
        result = library_version(sys.argv[1]) if len(sys.argv) > 1 else serving_process_nccl()
    except Exception as e:  # noqa: BLE001  (reported, not raised: the audit names it)
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
    print(json.dumps(result))
