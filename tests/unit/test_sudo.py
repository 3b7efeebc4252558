"""Whether the toolkit's privileged paths (private uploads, rsync's remote side, commands reached from another
host's operation) run under sudo: as pyinfra decides it, from the host's `_sudo` data or the command line's
`--sudo`, read in real pyinfra runs (@local)."""

import os
import subprocess
import sys

import pytest

DEPLOY = """
from pyinfra import host, logger
from deploys.ops import uses_sudo
logger.warning(f"uses_sudo={uses_sudo(host)}")
"""


@pytest.mark.parametrize("args, want", [([], False), (["--sudo"], True), (["--data", "_sudo=true"], True),
                                        (["--sudo", "--data", "_sudo=false"], False)])
def test_the_effective_privilege_is_read_as_pyinfra_reads_it(tmp_path, args, want):
    (tmp_path / "deploy.py").write_text(DEPLOY)
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    proc = subprocess.run([pyinfra, "-y", *args, "@local", str(tmp_path / "deploy.py")], capture_output=True,
                          text=True, timeout=120, cwd=os.getcwd())
    assert f"uses_sudo={want}" in proc.stderr + proc.stdout, proc.stderr[-2000:]
