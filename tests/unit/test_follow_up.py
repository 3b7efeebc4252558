"""Follow-up steps decided from state (deploys/ops.py follow_up_done): the fingerprint the deploy computes
for the content it writes is the one the node's shell records for the files holding it."""

import subprocess

from deploys.ops import content_fingerprint, files_fingerprint_command


def test_node_side_fingerprint_of_the_files_equals_the_fingerprint_of_their_content(tmp_path):
    a, b = tmp_path / "a file.conf", tmp_path / "b.env"
    a.write_text("[Manager]\nDefaultLimitNOFILE=1048576\n")
    b.write_text("X=1\n")
    out = subprocess.run(["sh", "-c", files_fingerprint_command((str(a), str(b)))], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == content_fingerprint(a.read_text(), b.read_text())
    b.write_text("X=2\n")  # another content: another fingerprint
    out2 = subprocess.run(["sh", "-c", files_fingerprint_command((str(a), str(b)))], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert out2 != out


DEPLOY = '''
import grp, os, pwd
from io import StringIO
import deploys.ops as ops
ops.FOLLOW_UP_DIR = {stamps!r}
me, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
ops.atomic_put(name="Write the file", src=StringIO("wanted\\n"), dest={path!r}, user=me, group=group, mode="0644",
               resets=ops.follow_up_stamp("t"))
ops.follow_up_done(name="Apply it", stamp="t", command={command!r}, paths=({path!r},), contents=("wanted\\n",),
                   needed=os.path.exists({needed!r}))
'''


def _run(tmp_path):
    import json
    import os
    import sys

    pyinfra = os.path.join(os.path.dirname(sys.executable), "pyinfra")
    proc = subprocess.run([pyinfra, "-y", "--json", "@local", str(tmp_path / "deploy.py")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    try:
        ops = json.loads(proc.stdout)["results"]["operations"]
    except (ValueError, KeyError):
        ops = []
    return proc.returncode, [op["name"] for op in ops if op["success"]]


def test_a_failed_follow_up_is_done_by_the_next_run_and_a_rewrite_runs_it_again(tmp_path):
    """Real pyinfra runs on @local: the write succeeds, its follow-up fails; the next run (the file unchanged)
    runs the follow-up; then nothing; a hand edit the deploy reverts runs it once more."""
    path, flag, log = tmp_path / "managed.conf", tmp_path / "may-apply", tmp_path / "applied.log"
    (tmp_path / "deploy.py").write_text(DEPLOY.format(
        stamps=str(tmp_path / "stamps"), path=str(path),
        command=f"test -e {flag} && cat {path} >> {log}", needed=str(tmp_path / "needed")))
    rc, changed = _run(tmp_path)
    assert rc != 0 and path.read_text() == "wanted\n" and not log.exists()  # written, follow-up failed
    flag.touch()
    rc, changed = _run(tmp_path)
    assert rc == 0 and changed == ["Apply it"] and log.read_text() == "wanted\n"
    rc, changed = _run(tmp_path)
    assert rc == 0 and changed == [] and log.read_text() == "wanted\n"
    path.write_text("edited by hand\n")
    rc, changed = _run(tmp_path)
    assert rc == 0 and changed == ["Write the file", "Apply it"] and log.read_text() == "wanted\nwanted\n"

    # the applied state says it did not take (a service that reports it runs older files): run again, stamp or not
    (tmp_path / "needed").touch()
    rc, changed = _run(tmp_path)
    assert rc == 0 and changed == ["Apply it"] and log.read_text() == "wanted\nwanted\nwanted\n"
