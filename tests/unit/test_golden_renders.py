"""Every file the deploy renders for the three reference profiles (`python -m deploys.render` of inventories/lab.py,
profile C's gaps filled in as an admin would), byte for byte as committed under tests/unit/golden/lab/: a
restructuring that changes one byte of what a node receives fails here, naming the file and the lines.

A change that means to change a rendered file regenerates them and shows the diff with the change:

    UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_golden_renders.py

Two values differ per run and are written as placeholders: the control node's endpoint folder (the unit tier makes its
own CA and keys, tests/unit/conftest.py) and the folder the inventory copy sits in."""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys

from tests.unit.profiles import lab_filled_in

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "lab")
PLACEHOLDERS = (("INFERENCE_NODES_ENDPOINT_DIR", "<endpoint folder>"),)


def rendered(tmp_path) -> dict[str, str]:
    """Relative path -> text of every rendered file, per-run folders replaced by placeholders."""
    lab = lab_filled_in(tmp_path / "inventory")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "deploys.render", lab, str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    swaps = [(os.environ[var], mark) for var, mark in PLACEHOLDERS] + [(str(tmp_path / "inventory"), "<inventory copy>")]
    files = {}
    for root, _, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            with open(path) as f:
                text = f.read()
            for value, mark in swaps:
                text = text.replace(value, mark)
            files[os.path.relpath(path, out)] = text
    return files


def test_every_rendered_file_of_the_three_profiles_is_byte_identical_to_the_committed_one(tmp_path):
    files = rendered(tmp_path)
    assert len(files) > 50 and any(p.endswith("grandpa.container") for p in files), sorted(files)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        shutil.rmtree(GOLDEN, ignore_errors=True)
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(GOLDEN, rel)), exist_ok=True)
            with open(os.path.join(GOLDEN, rel), "w") as f:
                f.write(text)
    golden = {}
    for root, _, names in os.walk(GOLDEN):
        for name in names:
            with open(os.path.join(root, name)) as f:
                golden[os.path.relpath(os.path.join(root, name), GOLDEN)] = f.read()
    assert sorted(files) == sorted(golden), (f"rendered but not committed: {sorted(set(files) - set(golden))}; "
                                             f"committed but not rendered: {sorted(set(golden) - set(files))}")
    changed = [rel for rel in sorted(files) if files[rel] != golden[rel]]
    diff = "".join(line for rel in changed[:3] for line in difflib.unified_diff(
        golden[rel].splitlines(True), files[rel].splitlines(True), f"golden/{rel}", f"rendered/{rel}"))
    assert not changed, f"{len(changed)} rendered file(s) differ from tests/unit/golden/lab/: {changed}\n{diff[:4000]}"
