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
