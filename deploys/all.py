"""Entry point: `pyinfra -y inventories/lab.py deploys/all.py`.

Order: validate -> preflight -> NVIDIA driver -> (container runtime: not yet) -> host tuning -> (model,
service: not yet). Components still to come are absent, not stubbed.
"""

from deploys.host_tuning import host_tuning
from deploys.nvidia_driver import nvidia_driver
from deploys.preflight import preflight
from deploys.validate import validate

validate()
preflight()
nvidia_driver()
host_tuning()
