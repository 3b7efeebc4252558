"""The lent GPU machine as `@local` (Ubuntu 24.04, real driver 580): facts and preflight on real hardware.

Used by tests/device/capture.sh only; nothing here is a deployment.
"""

h200 = [("@local", {})]
