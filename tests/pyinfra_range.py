"""The unit tier with the oldest and the newest pyinfra the pin allows (pyproject.toml), each in a venv of its own
beside the project's, unless it is the one installed (the whole suite runs with that one):

    python -m tests.pyinfra_range [--list]

Prints one line per end of the range: which release, and whether the unit tier ran with it here or there.
The releases come from PyPI (`pip index versions`); exit status 1 if the tier fails with either."""

from __future__ import annotations

import os
import re
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
        venv = f"{VENVS}-{version}"
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
