"""Sandbox stand-ins (applied last, to inventories/sandbox.py hosts only): local nodes instead of GPU boxes.

The stand-in NVIDIA repo is built, signed with a throwaway key and served on 127.0.0.1:8801 by
tests/sandbox/node.sh; its fingerprint is read from the file the harness writes.
"""

import os
import platform

__all__ = [
    "node_arch", "model_size_gb", "nvidia_repo_url", "nvidia_repo_key_url", "nvidia_repo_key_fingerprint",
    "nvidia_module_root", "allow_reboot",
]

# The sandbox nodes run on this machine's CPU, whatever the profile's real hardware is.
node_arch = platform.machine()
# The stand-in hub serves a small generated repo, not the 167 GB checkpoint.
model_size_gb = 0.1

nvidia_repo_url = "http://127.0.0.1:8801/cuda/repos"
nvidia_repo_key_url = "http://127.0.0.1:8801/standin-key.asc"
try:
    with open(os.path.join(os.environ.get("SANDBOX_DIR", "/var/tmp/inference-nodes-sandbox"), "standin-repo/fingerprint")) as f:
        nvidia_repo_key_fingerprint = f.read().strip()
except FileNotFoundError:  # repo not built yet: a fingerprint no key has, so the deploy refuses the key
    nvidia_repo_key_fingerprint = "F" * 40
# The stand-in "kernel module" is loaded into /run at boot by a harness unit (tests/sandbox/node.sh).
nvidia_module_root = "/run/stand-in-gpu"
# Throwaway nodes: a driver install reboots them, as a lab would after `allow_reboot: true`.
allow_reboot = True
