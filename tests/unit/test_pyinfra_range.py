"""pyinfra patch releases are accepted (one range in pyproject.toml and config.py), and no toolkit module replaces
any part of pyinfra."""

from __future__ import annotations

import re
import subprocess
import sys

from packaging.version import Version

from tests.pyinfra_range import ends, pinned_range

PROBE = r"""
import importlib, pkgutil, sys
import pyinfra, pyinfra_cli

def modules(package):
    for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if found.name.endswith("__main__") or found.name == "deploys.all":  # programs, not modules
            continue
        try:
            importlib.import_module(found.name)
        except Exception:  # a connector whose optional dependency is missing, say
            pass

def snapshot():
    seen = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in ("pyinfra", "pyinfra_cli"):
            continue
        for attr, value in list(vars(module).items()):
            seen[(name, attr)] = value
            if isinstance(value, type) and value.__module__ == name:
                for inner, member in list(vars(value).items()):
                    seen[(name, attr, inner)] = member
    return seen

modules(pyinfra); modules(pyinfra_cli)
before = snapshot()
import deploys, facts
modules(deploys); modules(facts)
after = snapshot()
print("\n".join(".".join(k) for k, v in before.items() if after.get(k, v) is not v) or "nothing replaced")
"""


def test_the_pin_is_a_patch_range_and_config_requires_the_same():
    allowed = pinned_range()
    assert Version("3.10.0") in allowed and Version("3.10.7") in allowed
    assert Version("3.11.0") not in allowed and Version("3.9.2") not in allowed
    config = open("config.py").read()
    assert re.search(rf'REQUIRE_PYINFRA_VERSION = "{re.escape(str(allowed))}"', config), config
    assert ends(allowed, [Version(v) for v in ("3.9.2", "3.10.0", "3.10.1", "3.11.0", "3.10.2rc1")]) == (
        Version("3.10.0"), Version("3.10.1"))


def test_no_toolkit_module_replaces_a_pyinfra_attribute():
    """Every pyinfra module and class attribute is the same object after importing every toolkit module: the
    toolkit works through pyinfra's public API only, so any release the pin allows runs it as it is."""
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "nothing replaced", probe.stdout


def test_every_fact_read_and_operation_goes_through_the_toolkits_own_helpers():
    """Facts are read through deploys/run/reads.py (kept while nothing changed, batched), never host.get_fact
    directly; operations are the toolkit's own (deploys/run/reads.py operation): an operation of pyinfra's would
    read its facts on its own and make the kept answers stale after every run of it."""
    import pathlib

    direct, builtin = [], []
    for path in pathlib.Path("deploys").rglob("*.py"):
        text = path.read_text()
        if path.as_posix() != "deploys/run/reads.py":
            direct += [f"{path}:{n}" for n, line in enumerate(text.splitlines(), 1) if ".get_fact(" in line]
            builtin += [f"{path}:{n}" for n, line in enumerate(text.splitlines(), 1)
                        if re.match(r"\s*@(pyinfra\.api\.)?operation\b", line) is None and "from pyinfra.api import" in line
                        and re.search(r"\boperation\b", line)]
        builtin += [f"{path}: {m}" for m in re.findall(r"from pyinfra\.operations import ([\w, ]+)", text)
                    if m.strip() != "server"]  # server.reboot's body, yielded from the driver's own operation
    assert not direct, f"host.get_fact called directly (use deploys.run.reads.read): {direct}"
    assert not builtin, f"pyinfra's own operations or decorator used (use the toolkit's): {builtin}"


def test_a_changed_pin_gets_a_new_range_venv_and_the_stale_one_goes(tmp_path, monkeypatch):
    from tests import pyinfra_range

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["pyinfra~=3.10.0", "pydantic==2.14.4"]\n'
                         '[project.optional-dependencies]\ntest = ["pytest==9.2.0"]\n')
    first = pyinfra_range.pins_key(str(pyproject))
    assert pyinfra_range.pins_key(str(pyproject)) == first
    pyproject.write_text(pyproject.read_text().replace("pytest==9.2.0", "pytest==9.2.1"))
    second = pyinfra_range.pins_key(str(pyproject))
    assert second != first, "a changed test pin must name another venv"
    monkeypatch.setattr(pyinfra_range, "VENVS", str(tmp_path / "range"))
    stale, other_release = tmp_path / f"range-3.10.0-{first}", tmp_path / f"range-3.10.1-{first}"
    for d in (stale, other_release, tmp_path / "range-3.10.0"):  # the unkeyed name of earlier versions too
        (d / "bin").mkdir(parents=True)
    venv = pyinfra_range.venv_for(Version("3.10.0"), second)
    assert venv == str(tmp_path / f"range-3.10.0-{second}")
    assert not stale.exists() and not (tmp_path / "range-3.10.0").exists()
    assert other_release.exists(), "another release's venv is not this one's to remove"
