"""The service image's pull (deploys/container_runtime.py image_present) on real pyinfra runs (@local), with a
stand-in `podman` first in PATH: a pull that leaves another digest than the pinned one fails the host naming
both; the pinned digest present (the image's own, or an index digest among its repo digests) is a no-op."""

import os
import subprocess
import sys

GOOD = "sha256:" + "a" * 64
BAD = "sha256:" + "b" * 64
REF = "registry.example/vllm:1"

PODMAN = """#!/bin/sh
state={state}
case "$1 $2" in
  "image inspect") [ -s "$state" ] && cat "$state" || exit 125 ;;
  pull*) cat {pulls} > "$state" ;;
  *) exit 2 ;;
esac
"""

DEPLOY = f"""
from deploys.container_runtime import image_present
image_present(name="Pull the service image by digest", image={REF.split('@')[0]!r}, digest={GOOD!r})
"""


def _run(tmp_path):
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run([pyinfra, "-y", "--json", "@local", str(tmp_path / "deploy.py")], capture_output=True,
                          text=True, timeout=120, cwd=os.getcwd(), env=env)
    return proc


def test_a_pull_that_leaves_another_digest_fails_naming_both_and_the_pinned_one_is_kept(tmp_path):
    (tmp_path / "bin").mkdir()
    state, pulls = tmp_path / "local-digest", tmp_path / "registry-serves"
    podman = tmp_path / "bin" / "podman"
    podman.write_text(PODMAN.format(state=state, pulls=pulls))
    podman.chmod(0o755)
    (tmp_path / "deploy.py").write_text(DEPLOY)

    pulls.write_text(BAD + "\n")  # the registry serves another image under the reference
    proc = _run(tmp_path)
    assert proc.returncode != 0
    assert f"pulled {REF}@{GOOD} but it answers to {BAD}, want {GOOD}" in proc.stderr, proc.stderr[-2000:]

    pulls.write_text(GOOD + "\n")
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert state.read_text().strip() == GOOD
    pulls.write_text(BAD + "\n")  # present already: nothing is pulled again
    proc = _run(tmp_path)
    assert proc.returncode == 0 and state.read_text().strip() == GOOD, proc.stderr[-2000:]
    assert "[@local] No changes" in proc.stderr
    # a multi-arch image pinned by its index digest: podman's .Digest is the platform manifest's, the index digest
    # is among its repo digests; present, it is not pulled again (containers/podman#24858)
    state.write_text(f"{BAD} {REF.split(':')[0]}@{GOOD}\n")
    pulls.write_text(BAD + "\n")
    proc = _run(tmp_path)
    assert proc.returncode == 0 and "[@local] No changes" in proc.stderr, proc.stderr[-2000:]
