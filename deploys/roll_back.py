"""Entry point: `pyinfra -y INVENTORY deploys/roll_back.py --limit CLUSTER [--data roll_back_from=ID,ID]`.

Takes each limited cluster off the release it serves (the inventory's, or the ids `roll_back_from` names) back to
the good release it served before, workers first, gated; the release left is recorded as failed on every member, so
a plain converge of the same inventory holds it back (deploys/service/roll_back.py). A rollout's `--abort` runs it
on the clusters it switched. A cluster that serves no release to leave changes nothing.
"""

from deploys.inventory import is_inference_node
from deploys.run.ssh_nodelay import install as ssh_without_delay
from deploys.service.roll_back import release_back
from deploys.validate import validate

ssh_without_delay()
validate()
if is_inference_node():  # (a monitoring-only host serves no release)
    release_back()
