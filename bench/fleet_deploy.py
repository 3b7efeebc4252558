"""The model's part of deploys/all.py, for light nodes (bench/fleet.py): validate, the snapshot (sync, fan-out,
verify) and its integrity (the start gate, the deep verify timer); no driver, runtime or service."""

from deploys.model.integrity import model_integrity
from deploys.model.snapshot import model_snapshot
from deploys.run.ssh_nodelay import install as ssh_without_delay
from deploys.validate import validate

ssh_without_delay()
validate()
model_snapshot()
model_integrity()
