"""files/apt/install_signing_key.sh with the real gpg, on throwaway keys: only a file holding exactly the
pinned primary key (with its own subkeys) is installed, and the installed keyring holds that key alone;
the KeyringFingerprints fact that decides "already installed" sees every primary key of a keyring."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from facts.apt import KeyringFingerprints

SCRIPT = Path(__file__).parents[2] / "files" / "apt" / "install_signing_key.sh"


def gpg(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["gpg", "--batch", "--passphrase", "", *args], env={**os.environ, "GNUPGHOME": str(home)},
                          capture_output=True, check=True)


def primaries(home: Path, keyfile: Path) -> list[str]:
    out = gpg(home, "--show-keys", "--with-colons", str(keyfile)).stdout.decode()
    return KeyringFingerprints().process(out.splitlines())


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """The pinned key (a signing primary with an encryption subkey, like a repo key) and an unrelated one,
    as armored and binary key files, as a two-key bundle, and the pinned key with the other's subkey grafted."""
    d = tmp_path_factory.mktemp("keys")
    home = d / "gnupg"
    home.mkdir(mode=0o700)
    gpg(home, "--quick-gen-key", "Pinned Repo <pinned@example.org>", "ed25519", "sign", "never")
    gpg(home, "--quick-gen-key", "Intruder <intruder@example.org>", "ed25519", "sign", "never")
    colons = gpg(home, "--list-keys", "--with-colons").stdout.decode().splitlines()
    pinned, other = KeyringFingerprints().process(colons)
    gpg(home, "--quick-add-key", pinned, "cv25519", "encr", "never")
    gpg(home, "--quick-add-key", other, "cv25519", "encr", "never")
    files = {"home": home, "pinned": pinned, "other": other}
    for name, args in {"pinned.asc": ["--armor", pinned], "pinned.gpg": [pinned], "other.asc": ["--armor", other],
                       "bundle.asc": ["--armor", pinned, other], "bundle.gpg": [pinned, other]}.items():
        (d / name).write_bytes(gpg(home, "--export", *args).stdout)
        files[name] = d / name
    # the other key's subkey and its binding signature (from its first public-subkey packet on), appended
    # to the pinned key: gpg reads them as a subkey of the pinned key with a binding it cannot verify
    (d / "other.gpg").write_bytes(gpg(home, "--export", other).stdout)
    packets = gpg(home, "--list-packets", str(d / "other.gpg")).stdout.decode()
    start = int(re.search(r"# off=(\d+) ctb=\w+ tag=14 ", packets).group(1))
    (d / "grafted.gpg").write_bytes((d / "pinned.gpg").read_bytes() + (d / "other.gpg").read_bytes()[start:])
    files["grafted.gpg"] = d / "grafted.gpg"
    yield files
    subprocess.run(["gpgconf", "--kill", "all"], env={**os.environ, "GNUPGHOME": str(home)})


def install(keyfile: Path, fingerprint: str, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SCRIPT), f"file://{keyfile}", fingerprint, str(dest)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("name", ["pinned.asc", "pinned.gpg"])
def test_single_pinned_key_is_installed_armored_or_binary(keys, tmp_path, name):
    dest = tmp_path / "keyrings" / "repo.gpg"
    proc = install(keys[name], keys["pinned"], dest)
    assert proc.returncode == 0, proc.stderr
    assert dest.stat().st_mode & 0o777 == 0o644
    assert not dest.read_bytes().startswith(b"-----BEGIN"), "apt wants the binary form"
    assert primaries(keys["home"], dest) == [keys["pinned"]]
    listing = gpg(keys["home"], "--show-keys", "--with-colons", str(dest)).stdout.decode()
    assert "\nsub:" in listing, "the pinned key's own subkey is kept"


def test_a_subkey_grafted_from_another_key_does_not_reach_the_keyring(keys, tmp_path):
    packets = gpg(keys["home"], "--list-packets", str(keys["grafted.gpg"])).stdout.decode()
    assert packets.count(" tag=14 ") == 2, "the file carries the pinned key's subkey and the grafted one"
    dest = tmp_path / "repo.gpg"
    assert install(keys["grafted.gpg"], keys["pinned"], dest).returncode == 0
    assert dest.read_bytes() == keys["pinned.gpg"].read_bytes(), "only the pinned key, as gpg exports it"


@pytest.mark.parametrize("name", ["bundle.asc", "bundle.gpg"])
def test_bundle_of_the_pinned_key_and_another_is_refused(keys, tmp_path, name):
    dest = tmp_path / "repo.gpg"
    proc = install(keys[name], keys["pinned"], dest)
    assert proc.returncode != 0
    assert "exactly one primary key" in proc.stderr and keys["other"] in proc.stderr
    assert not dest.exists()


def test_wrong_key_is_refused_and_an_existing_keyring_left_alone(keys, tmp_path):
    dest = tmp_path / "repo.gpg"
    dest.write_bytes(b"previous")
    proc = install(keys["other.asc"], keys["pinned"], dest)
    assert proc.returncode != 0 and keys["pinned"] in proc.stderr
    assert dest.read_bytes() == b"previous"


def test_unreachable_key_is_refused(keys, tmp_path):
    proc = install(tmp_path / "missing.asc", keys["pinned"], tmp_path / "repo.gpg")
    assert proc.returncode != 0 and not (tmp_path / "repo.gpg").exists()


def test_fact_lists_every_primary_key_and_no_subkey(keys):
    """keyring_verified is a no-op only when the fact is exactly [pinned]: a tampered keyring on the node
    (an extra primary key) reads as two keys, so it is replaced."""
    assert primaries(keys["home"], keys["pinned.gpg"]) == [keys["pinned"]]
    assert sorted(primaries(keys["home"], keys["bundle.gpg"])) == sorted([keys["other"], keys["pinned"]])
    assert KeyringFingerprints().process([]) == []
