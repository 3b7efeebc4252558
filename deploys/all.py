"""Entry point: `pyinfra -y inventories/lab.py deploys/all.py`.

Order: validate -> preflight -> release asked for (one that failed here is held back: its image, model and service
steps skip themselves) -> package manager (lock wait, dpkg repair) -> monitoring host (Prometheus and Alertmanager on
the host of the group `monitoring`: before every release step, so the lab's scrape targets and rules never wait for a
cluster's sync, switch or gate) -> NVIDIA driver -> container runtime -> host tuning -> model snapshot -> model
integrity (deep verify timer) -> inference service -> endpoint (heads) -> node metrics -> the monitoring host adds the
nodes new to it (their metrics set up by now: a first converge never pages as down) -> the held-back release said
(the host fails).

A monitoring-only host (the group `monitoring`, no serving cluster) runs validate, the package manager and the
monitoring host's step only.
"""

from deploys.apt_state import package_manager_ready
from deploys.container_runtime import container_runtime
from deploys.endpoint import endpoint
from deploys.host_tuning import host_tuning
from deploys.inventory import is_inference_node
from deploys.model.integrity import model_integrity
from deploys.model.snapshot import model_snapshot
from deploys.monitoring.host import monitoring_host, monitoring_targets_added
from deploys.monitoring.node import node_metrics
from deploys.nvidia_driver import nvidia_driver
from deploys.preflight import preflight
from deploys.run.ssh_nodelay import install as ssh_without_delay
from deploys.service.deploy import inference_service
from deploys.service.failed_release import release_asked, release_held_reported
from deploys.validate import validate

ssh_without_delay()  # pyinfra has connected: each node's SSH socket sends at once from here on
validate()
if is_inference_node():
    preflight()
    release_asked()
package_manager_ready()
monitoring_host()
if is_inference_node():  # (a monitoring-only host ends here: Prometheus and Alertmanager, nothing of a GPU node)
    nvidia_driver()
    container_runtime()
    host_tuning()
    model_snapshot()
    model_integrity()
    inference_service()
    endpoint()
    node_metrics()
monitoring_targets_added()  # the monitoring host: nodes new to it join, now that this run set up their metrics
if is_inference_node():
    release_held_reported()  # last: a host whose switch was held back fails, saying why
