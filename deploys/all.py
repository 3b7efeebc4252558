"""Entry point: `pyinfra -y inventories/lab.py deploys/all.py`.

Order: validate -> preflight -> NVIDIA driver -> container runtime -> host tuning -> model snapshot ->
(service: not yet). Components still to come are absent, not stubbed.
"""

from deploys.container_runtime import container_runtime
from deploys.host_tuning import host_tuning
from deploys.model_snapshot import model_snapshot
from deploys.nvidia_driver import nvidia_driver
from deploys.preflight import preflight
from deploys.validate import validate

validate()
preflight()
nvidia_driver()
container_runtime()
host_tuning()
model_snapshot()
