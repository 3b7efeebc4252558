"""pyproject.toml ships what the deploys import and send: every package folder, and every data file under files/."""

from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _tracked(folder: str) -> list[str]:
    return subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()


def test_every_python_folder_is_a_listed_package():
    packages = set(_setuptools()["packages"])
    folders = {str(Path(p).parent).replace("/", ".") for top in ("deploys", "facts", "files") for p in _tracked(top)
               if p.endswith(".py")}
    assert folders <= packages, sorted(folders - packages)


def test_every_data_file_under_files_is_package_data():
    config = _setuptools()
    data = config.get("package-data", {})
    missing = []
    for path in _tracked("files"):
        if path.endswith(".py"):
            continue
        package, name = str(Path(path).parent).replace("/", "."), Path(path).name
        if package not in config["packages"] or not any(fnmatch.fnmatch(name, g) for g in data.get(package, [])):
            missing.append(path)
    assert not missing, missing
