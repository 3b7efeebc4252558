"""The launch-argument check: before a unit changes, the image's own vLLM parses the new command line, so a
refusal fails the host before anything is written and the running service keeps running."""

from __future__ import annotations

import hashlib
import shlex

from pyinfra import host
from pyinfra.api import StringCommand
from pyinfra.facts.files import Sha256File

from deploys.run.reads import operation, read
from deploys.schema import NodeConfig
from deploys.service.unit import ARGS_CHECK


def args_check_command(cfg: NodeConfig, argv: list[str]) -> str:
    """Shell command that parses ``argv`` with the vLLM inside the pinned image (nothing starts)."""
    # least privilege: it opens no socket; a host whose containers cannot have a network namespace of their own
    # (a nested container cannot bring its loopback up) says so in its inventory (vllm_args_check_network)
    run = ["podman", "run", "--rm", "--pull=never", f"--network={cfg.vllm_args_check_network}", "--cap-drop=all",
           "--security-opt=no-new-privileges", f"--entrypoint={cfg.vllm_python}",
           "-v", f"{ARGS_CHECK}:/run/inference-nodes-check_vllm_args.py:ro", cfg.image_ref,
           "/run/inference-nodes-check_vllm_args.py", *argv]
    refused = f"the vLLM in {cfg.image_ref} refused the new command line; the unit was not changed"
    return f"{shlex.join(run)} || {{ echo {shlex.quote(refused)} >&2; exit 1; }}"


@operation()
def vllm_accepts(unit_path: str, unit_text: str, check: str | None):
    """Before a unit changes, its vLLM command line is parsed by the image's own vLLM; a refusal fails
    this host before the unit is written, so the running service keeps running untouched.

    + unit_path: the installed unit
    + unit_text: the unit about to be installed
    + check: the check command (None: the image's own script builds the arguments, nothing to parse)
    """
    installed = read(host, Sha256File, path=unit_path)
    if installed == hashlib.sha256(unit_text.encode()).hexdigest():
        host.noop("unit unchanged, its command line was checked when it was installed")
        return
    if check is None:
        host.noop("image_env launch: the image's script builds vLLM's arguments from the environment")
        return
    yield StringCommand(check)
