"""Sandbox stand-ins (applied last, to inventories/sandbox.py hosts only): local nodes instead of GPU boxes."""

import platform

# The sandbox nodes run on this machine's CPU, whatever the profile's real hardware is.
node_arch = platform.machine()
# The stand-in hub serves a small generated repo, not the 167 GB checkpoint.
model_size_gb = 0.1
