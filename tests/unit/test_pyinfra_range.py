"""pyinfra patch releases are accepted (one range in pyproject.toml and config.py), and the speed-ups that replace
pyinfra internals (deploys/run/fact_cache.py, op_overhead.py) turn themselves off, with a warning, on a release
they were not tested with."""

from __future__ import annotations

import re
import subprocess
import sys

from packaging.version import Version

from tests.pyinfra_range import ends, pinned_range

PROBE = """
import pyinfra
pyinfra.__version__ = {version!r}
from pyinfra.api.host import Host
from pyinfra.api import util
import deploys
print("cache", getattr(Host.get_fact, "_per_run_cache", False), "stack", util.stack.__module__)
"""


def test_the_pin_is_a_patch_range_and_config_requires_the_same():
    allowed = pinned_range()
    assert Version("3.10.0") in allowed and Version("3.10.7") in allowed
    assert Version("3.11.0") not in allowed and Version("3.9.2") not in allowed
    config = open("config.py").read()
    assert re.search(rf'REQUIRE_PYINFRA_VERSION = "{re.escape(str(allowed))}"', config), config
    assert ends(allowed, [Version(v) for v in ("3.9.2", "3.10.0", "3.10.1", "3.11.0", "3.10.2rc1")]) == (
        Version("3.10.0"), Version("3.10.1"))


def _probe(version: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE.format(version=version)], capture_output=True, text=True,
                          timeout=120)


def test_the_speed_ups_are_on_only_with_a_tested_pyinfra():
    from deploys import TESTED_PYINFRA

    tested = _probe(TESTED_PYINFRA[0])
    assert tested.returncode == 0, tested.stderr
    assert tested.stdout.split() == ["cache", "True", "stack", "deploys.run.op_overhead"]
    untested = _probe("3.10.9")
    assert untested.returncode == 0, untested.stderr
    assert untested.stdout.split() == ["cache", "False", "stack", "inspect"]
    assert "pyinfra 3.10.9: the toolkit's speed-ups" in untested.stderr + untested.stdout
    assert "stay off" in untested.stderr + untested.stdout
