"""The toolkit's own file and directory operations (deploys/ops.py file_absent, directory_present), run by the real
pyinfra CLI on @local: they change what differs, then nothing; what is not theirs to touch fails the host."""

import json
import os
import stat
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = '''
import grp, os, pwd
import deploys.ops as ops
me, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
ops.directory_present(name="Directory", path={directory!r}, user=me, group=group, mode="0750")
ops.file_absent(name="Absent", path={absent!r})
'''


def _run(tmp_path) -> tuple[int, list[str], str]:
    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    proc = subprocess.run([pyinfra, "-y", "--json", "@local", str(tmp_path / "deploy.py")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT})
    try:
        ops = json.loads(proc.stdout)["results"]["operations"]
    except (ValueError, KeyError):
        ops = []
    changed = [op["name"] for op in ops if op["success"] and op["success"] != op.get("no_change")]
    return proc.returncode, changed, proc.stderr


def test_a_directory_is_made_and_kept_and_a_file_removed_then_nothing(tmp_path):
    directory, absent = tmp_path / "a" / "b", tmp_path / "stale.conf"
    absent.write_text("old")
    (tmp_path / "deploy.py").write_text(DEPLOY.format(directory=str(directory), absent=str(absent)))
    rc, _, err = _run(tmp_path)
    assert rc == 0, err[-2000:]
    assert stat.S_IMODE(directory.stat().st_mode) == 0o750 and not absent.exists()
    directory.chmod(0o777)
    rc, _, err = _run(tmp_path)
    assert rc == 0 and stat.S_IMODE(directory.stat().st_mode) == 0o750, err[-2000:]
    rc, _, err = _run(tmp_path)
    assert rc == 0 and "No changes" in err and "Success" not in err, err[-2000:]


def test_a_directory_where_a_file_should_be_absent_fails_the_host(tmp_path):
    absent = tmp_path / "stale.conf"
    absent.mkdir()
    (tmp_path / "deploy.py").write_text(DEPLOY.format(directory=str(tmp_path / "d"), absent=str(absent)))
    rc, _, err = _run(tmp_path)
    assert rc != 0 and f"{absent} is not a file" in err, err[-2000:]
    assert absent.is_dir()
