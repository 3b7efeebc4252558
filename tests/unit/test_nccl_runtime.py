"""The NCCL runtime check: the version is read from the loaded library (a real shared library built here
with the NCCL version call), and the known-bad list is data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from files.inference_service import nccl_runtime
from files.inference_service.nccl_runtime import known_bad, version_string

HELPER = nccl_runtime.__file__


@pytest.mark.parametrize("code,text", [(22903, "2.29.3"), (22809, "2.28.9"), (21810, "2.18.10"), (2708, "2.7.8")])
def test_version_codes(code, text):
    assert version_string(code) == text


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler")
def test_the_version_is_read_from_the_library_itself(tmp_path):
    src = tmp_path / "nccl.c"
    src.write_text("int ncclGetVersion(int *v) { *v = 22902; return 0; }\n")
    lib = tmp_path / "libnccl.so.2"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    out = subprocess.run([sys.executable, HELPER, str(lib)], capture_output=True, text=True, check=True)
    # as the audit runs it: the source through `python -c`, with no __file__
    inline = subprocess.run([sys.executable, "-c", open(HELPER).read(), str(lib)], capture_output=True, text=True)
    assert json.loads(inline.stdout) == json.loads(out.stdout), inline.stderr
    seen = json.loads(out.stdout)
    assert seen == {"version": "2.29.2", "library": str(lib)}
    missing = subprocess.run([sys.executable, HELPER, str(tmp_path / "nope.so")], capture_output=True, text=True)
    assert missing.returncode == 1 and "error" in json.loads(missing.stdout)


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler")
def test_the_library_named_is_the_file_that_answered(tmp_path):
    """Two libnccl.so.2 in one process, as after `import torch` with a pip wheel's NCCL: by soname the
    one already mapped answers and is named; by path (VLLM_NCCL_SO_PATH) that file answers and is named."""
    src = tmp_path / "nccl.c"
    src.write_text("int ncclGetVersion(int *v) { *v = VERSION; return 0; }\n")
    libs = {}
    for code in (22809, 22903):
        libs[code] = tmp_path / str(code) / "libnccl.so.2"
        libs[code].parent.mkdir()
        subprocess.run(["cc", "-shared", "-fPIC", f"-DVERSION={code}", "-Wl,-soname,libnccl.so.2", "-o",
                        str(libs[code]), str(src)], check=True)
    probe = ("import ctypes, json, sys; sys.path[:0] = [sys.argv[1]]; import nccl_runtime; ctypes.CDLL(sys.argv[2]); "
             "print(json.dumps([nccl_runtime.library_version(p) for p in sys.argv[3:]]))")
    out = subprocess.run([sys.executable, "-c", probe, os.path.dirname(HELPER), str(libs[22809]), "libnccl.so.2",
                          str(libs[22903])], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [{"version": "2.28.9", "library": str(libs[22809])},
                                      {"version": "2.29.3", "library": str(libs[22903])}]


# /proc/self/maps of the sandbox image's python after `import torch` and ctypes.CDLL("libnccl.so.2"), captured
# 2026-12-02 (an excerpt: torch, the NCCL wheel, an anonymous mapping, the stack; the look-alike
# /opt/other/libmynccl.so.2 line is added, not captured)
CAPTURED_MAPS = os.path.join(os.path.dirname(__file__), "fixtures", "proc-maps-sandbox-image-nccl.txt")


def test_the_mapped_nccl_is_found_in_a_captured_listing():
    with open(CAPTURED_MAPS) as f:
        lines = f.read().splitlines()
    wheel = "/opt/vllm/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"
    assert nccl_runtime.mapped_file("libnccl.so.2", lines) == wheel
    assert nccl_runtime.mapped_file("libnccl.so.2", [ln for ln in lines if "nvidia/nccl" not in ln]) is None


def test_known_bad_versions_fail_multi_node_aarch64_only():
    entry = known_bad("2.28.9", "aarch64", multi_node=True)
    assert entry["fixed_in"] == "2.29.3" and entry["source"].endswith("NVIDIA/nccl/issues/2353")
    assert known_bad("2.29.2", "aarch64", multi_node=True) is not None
    assert known_bad("2.29.3", "aarch64", multi_node=True) is None
    assert known_bad("2.28.9", "x86_64", multi_node=True) is None
    assert known_bad("2.28.9", "aarch64", multi_node=False) is None


def test_the_list_is_data_with_sources():
    with open(nccl_runtime.known_bad_path()) as f:
        entries = json.load(f)["known_bad"]
    assert entries and all(e["source"].startswith("https://") and e["versions"] for e in entries)
