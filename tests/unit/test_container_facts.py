"""ServiceStartedFrom: what the service's last start recorded, beside the snapshot stamp now, read by running
the fact's own command on real files."""

import hashlib
import subprocess

from facts.containers import ServiceStartedFrom


def _read(record, stamp, manifest=None) -> dict:
    fact = ServiceStartedFrom()
    out = subprocess.run(["sh", "-c", fact.command(record=str(record), stamp=str(stamp),
                                                   manifest=str(manifest) if manifest else None)],
                         capture_output=True, text=True, check=True).stdout
    return fact.process(out.splitlines())


def test_record_and_stamp_as_the_unit_writes_them(tmp_path):
    record, stamp = tmp_path / "inference.started-from", tmp_path / "stamp.json"
    manifest = tmp_path / "model-manifest.json"
    assert _read(record, stamp, manifest) == {"unit": None, "snapshot": None, "verified": None,
                                              "manifest": None}  # never started, not verified, no live release
    stamp.write_text('{"verdict": "ok"}\n')
    manifest.write_text('{"commit": "a"}\n')
    now = hashlib.sha256(stamp.read_bytes()).hexdigest()
    record.write_text(f"unitfingerprint\n{now}\n")
    assert _read(record, stamp, manifest) == {"unit": "unitfingerprint", "snapshot": now, "verified": now,
                                              "manifest": hashlib.sha1(manifest.read_bytes()).hexdigest()}
    assert _read(record, stamp)["manifest"] is None  # not asked for
    stamp.write_text('{"verdict": "ok", "repaired": true}\n')  # re-verified after a repair: another stamp
    assert _read(record, stamp)["verified"] != now
    record.write_text("unitfingerprint\n")  # a start killed while writing its record: not a complete record
    assert _read(record, stamp)["unit"] is None


def test_an_image_answers_to_its_own_digest_and_its_index_digest():
    """`podman image inspect` of an image pulled by its multi-arch index digest: `.Digest` is the per-platform
    manifest's, the index digest is only among `.RepoDigests` (containers/podman#24858)."""
    from facts.containers import PodmanImageDigests

    own, index = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    out = [f"{own} registry.example/vllm@{index} registry.example/vllm@{own}"]
    assert PodmanImageDigests().process(out) == [own, index]
    assert PodmanImageDigests().process([]) == []  # absent
    assert "{{range .RepoDigests}}" in PodmanImageDigests().command(ref="r@" + index)
