"""The new unit and service environment stay out of systemd's reach until the node's restart step (issue 51): the
shell that puts them in place, run here against files in a temporary directory with a stand-in `systemctl` (the
node tier runs it on real systemd, and kills a converge once it staged them: test_70)."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from deploys import ops
from deploys.service import unit

UNIT_TEXT, ENV_TEXT = "[Container]\nImage=new\n", "A=new\n"


def _sha256(text):
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def node(tmp_path, monkeypatch):
    """Live and staged directories under tmp_path, a `systemctl` that logs its arguments, stamps under tmp_path."""
    monkeypatch.setattr(ops, "STAGE_DIR", str(tmp_path / "staged"))
    monkeypatch.setattr(ops, "FOLLOW_UP_DIR", str(tmp_path / "follow-ups"))
    (tmp_path / "staged").mkdir()
    (tmp_path / "live").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/systemctl.log\n")
    (bin_dir / "systemctl").chmod(0o755)
    live = (str(tmp_path / "live" / "x.container"), str(tmp_path / "live" / "x.service.env"))

    def run(files):
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        return subprocess.run(["sh", "-c", unit.staged_install_command(files)], env=env, capture_output=True, text=True)
    return tmp_path, live, run


def test_the_restart_step_puts_exactly_the_rendered_files_in_place(node):
    tmp_path, (live_unit, live_env), run = node
    for path, text in ((live_unit, "[Container]\nImage=old\n"), (live_env, "A=old\n")):
        (tmp_path / "live" / os.path.basename(path)).write_text(text)
    (tmp_path / "staged" / "x.container").write_text(UNIT_TEXT)
    (tmp_path / "staged" / "x.service.env").write_text(ENV_TEXT)
    os.chmod(tmp_path / "staged" / "x.service.env", 0o600)
    out = run(((live_unit, _sha256(UNIT_TEXT)), (live_env, _sha256(ENV_TEXT))))
    assert out.returncode == 0, out.stderr
    assert open(live_unit).read() == UNIT_TEXT and open(live_env).read() == ENV_TEXT
    assert os.stat(live_env).st_mode & 0o777 == 0o600, "the environment keeps its 0600"
    assert os.listdir(tmp_path / "staged") == [] and (tmp_path / "systemctl.log").read_text() == "daemon-reload\n"
    stamp = (tmp_path / "follow-ups" / unit.QUADLET_STAMP).read_text().strip()
    assert stamp == ops.content_fingerprint(UNIT_TEXT), "the generator's follow-up is done for the unit in place"


def test_a_staged_copy_of_other_content_is_removed_and_the_live_file_kept(node):
    """A copy an older, killed run staged for another release is never started: only the content this converge
    rendered goes in place."""
    tmp_path, (live_unit, live_env), run = node
    (tmp_path / "live" / "x.container").write_text("[Container]\nImage=old\n")
    (tmp_path / "staged" / "x.container").write_text("[Container]\nImage=abandoned\n")
    out = run(((live_unit, _sha256(UNIT_TEXT)), (live_env, _sha256(ENV_TEXT))))
    assert out.returncode == 0, out.stderr
    assert open(live_unit).read() == "[Container]\nImage=old\n" and not os.path.exists(live_env)
    assert os.listdir(tmp_path / "staged") == []
    assert not (tmp_path / "systemctl.log").exists(), "nothing put in place: no generator run"
