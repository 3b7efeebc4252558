"""See every node working: node-exporter with the toolkit's own metrics on each node that turns monitoring on, and
Prometheus with Alertmanager on the one host of the inventory group `monitoring`, all from distribution packages.

On a node (`monitoring_enabled`): the distribution's `prometheus-node-exporter`, run as the toolkit's own unit
`inference-nodes-node-exporter.service` on loopback and `node_exporter_address` only (the package's own unit, which
listens on every address, is masked before it is installed), with a textfile directory that the stdlib program
files/monitoring/node_facts.py fills atomically on a systemd timer: driver branch and whether the loaded module is
the userspace driver, the last deep verify's and serving gate's verdict and time, free bytes under the model
directory, the service's state and restarts, and GPU figures from nvidia-smi (a cell it reports as `[N/A]`, like
GB10's memory, is left out, never exported as 0).

vLLM's own metrics, decided per head: with the endpoint on, Prometheus scrapes `/metrics` through it (TLS, the
`endpoint_metrics_client` key, loaded into Prometheus with systemd's `LoadCredential=`: no file the `prometheus`
user can read holds it); on the monitoring host itself, on loopback; otherwise the node's facts program reads
vLLM's `/metrics` on loopback and hands its `vllm:` series to node-exporter (the API never leaves loopback for it).

On the monitoring host: `prometheus` and `prometheus-alertmanager` as the toolkit's units on loopback, a scrape
configuration generated from the inventory (adding a node adds its targets), the toolkit's alert rules
(``render_rules``, checked by `promtool` before every start and reload), and Alertmanager posting to the webhook of
`alertmanager_webhook_url_file` (a secret: it may carry a token). A Grafana dashboard for the metrics the toolkit
exports and scrapes is written beside them (``render_dashboard``; Grafana itself is not in Debian or Ubuntu).

One job per module: node.py (the exporter and the facts timer on each node), host.py (Prometheus and
Alertmanager on the monitoring host, their configuration and units), rules.py (the alert rules), dashboard.py.
The rendered files' headers still name deploys/monitoring.py: other text would rewrite every node's units (and
restart them) on the next converge, so they change with the files' next real change.
"""
