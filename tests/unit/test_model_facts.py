"""The hub client and node Python facts (facts/model.py), their commands run on this machine."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import huggingface_hub
import pytest
from pyinfra.api.exceptions import FactProcessError

from facts.model import HubClient, NodePython


def _run(command: str) -> list[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout.splitlines()


def test_hub_client_reads_version_and_lock_hash(tmp_path):
    venv = tmp_path / "venv with space"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # this venv's huggingface_hub
    (venv / "bin/python").chmod(0o755)
    fact = HubClient()
    assert fact.process(_run(fact.command(venv=str(venv), lock_name="hub-client.lock"))) == {
        "version": huggingface_hub.__version__, "lock_sha256": None}
    (venv / "hub-client.lock").write_bytes(b"pins\n")
    assert fact.process(_run(fact.command(venv=str(venv), lock_name="hub-client.lock"))) == {
        "version": huggingface_hub.__version__, "lock_sha256": hashlib.sha256(b"pins\n").hexdigest()}


def test_hub_client_absent():
    fact = HubClient()
    assert fact.process(_run(fact.command(venv="/nonexistent/venv", lock_name="hub-client.lock"))) == {
        "version": None, "lock_sha256": None}


def test_node_python_version_and_machine():
    fact = NodePython()
    out = subprocess.run(["sh", "-c", fact.command().replace("python3", sys.executable, 1)], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert fact.process(out) == {"version": f"{sys.version_info[0]}{sys.version_info[1]}",
                                 "machine": os.uname().machine}
    with pytest.raises(FactProcessError):
        fact.process(["python3: command not found"])
