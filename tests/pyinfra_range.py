"""The unit tier with the oldest and the newest pyinfra the pin allows (pyproject.toml), each in a venv of its own
beside the project's (keyed by the pins: a changed pin installs a new one), unless it is the one installed (the whole
suite runs with that one):

    python -m tests.pyinfra_range [--list]

Prints one line per end of the range: which release, and whether the unit tier ran with it here or there.
The releases come from PyPI (`pip index versions`); exit status 1 if the tier fails with either."""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib

from packaging.specifiers import SpecifierSet
from packaging.version import Version

VENVS = os.environ.get("PYINFRA_RANGE_VENVS", "/var/tmp/inference-nodes-pyinfra")


def pinned_range(pyproject: str = "pyproject.toml") -> SpecifierSet:
    deps = tomllib.load(open(pyproject, "rb"))["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"pyinfra\b", d))
    return SpecifierSet(spec[len("pyinfra"):].split(";")[0].strip())


def pins_key(pyproject: str = "pyproject.toml") -> str:
    """What a range venv was installed from: the project's dependencies and test extras (a changed pin is a new venv)."""
    project = tomllib.load(open(pyproject, "rb"))["project"]
    pins = [*project["dependencies"], *project.get("optional-dependencies", {}).get("test", [])]
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]


def venv_for(version: Version, key: str) -> str:
    """The venv of one pyinfra release and these pins; the same release's venvs of other pins are removed."""
    venv = f"{VENVS}-{version}-{key}"
    for stale in glob.glob(f"{VENVS}-{version}-*") + glob.glob(f"{VENVS}-{version}"):
        if stale != venv:
            shutil.rmtree(stale, ignore_errors=True)
    return venv


def released() -> list[Version]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "pyinfra"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    listed = re.search(r"Available versions: (.*)", out)
    if not listed:
        raise SystemExit(f"pip index versions pyinfra: no list of releases in {out!r}")
    return sorted(Version(v.strip()) for v in listed.group(1).split(","))


def ends(allowed: SpecifierSet, versions: list[Version]) -> tuple[Version, Version]:
    inside = [v for v in versions if v in allowed and not v.is_prerelease]
    if not inside:
        raise SystemExit(f"no pyinfra release on PyPI is in {allowed}")
    return inside[0], inside[-1]


def main(argv: list[str]) -> int:
    import pyinfra

    allowed, installed = pinned_range(), Version(pyinfra.__version__)
    oldest, newest = ends(allowed, released())
    failed = False
    for version in sorted({oldest, newest}):
        which = " and ".join(w for w, v in (("oldest", oldest), ("newest", newest)) if v == version)
        if version == installed or "--list" in argv:
            print(f"pyinfra {version} ({which} allowed by {allowed}): "
                  + ("the installed one: the whole suite runs with it" if version == installed else "not installed"))
            continue
        venv = venv_for(version, pins_key())
        if not os.path.exists(f"{venv}/bin/pytest"):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
            subprocess.run([f"{venv}/bin/pip", "install", "-q", "-e", ".[test]", f"pyinfra=={version}"], check=True)
        proc = subprocess.run([f"{venv}/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit"])
        print(f"pyinfra {version} ({which} allowed by {allowed}): the unit tier "
              + ("passed" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"))
        failed |= proc.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
