"""The monitoring host (the one host of the inventory group `monitoring`): Prometheus and Alertmanager as the
toolkit's units on loopback, a scrape configuration generated from the inventory (adding a node adds its targets),
the alert rules, Alertmanager posting to the webhook of `alertmanager_webhook_url_file`, and the dashboard."""

from __future__ import annotations

import hashlib
import json
from io import StringIO

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, deploy
from pyinfra.facts.files import Link

from deploys.apt_state import APT_READS, apt_lists_updated
from deploys.inventory import host_config, inventory_configs, monitoring_only_configs
from deploys.monitoring.dashboard import render_dashboard
from deploys.monitoring.node import (
    DIR,
    DISTRO_UNITS,
    EXPORTER,
    FACTS,
    FACTS_CONFIG,
    UNIT_DIR,
    monitoring_host_name,
    render_exporter_unit,
    render_facts_config,
    render_facts_service,
    render_facts_timer,
)
from deploys.monitoring.host_files import (
    ALERTMANAGER,
    ALERTMANAGER_CONF,
    DASHBOARD,
    HOST_FILES,
    PROMETHEUS,
    PROMETHEUS_CONF,
    RULES,
    SCRAPED,
    ca_path,
    endpoint_scraped,
    render_alertmanager,
    render_alertmanager_unit,
    render_prometheus,
    render_prometheus_unit,
    scrape_key_id,
    scrape_key_path,
    scrape_keys,
)
from deploys.monitoring.rules import render_rules
from deploys.ops import (
    atomic_put,
    distro_unit_masked,
    follow_up_done,
    follow_up_reads,
    follow_up_stamp,
    packages_installed,
    secret_file,
    unit_running,
)
from deploys.run.reads import expect, operation, read, service_reads, unit_state
from deploys.schema import NodeConfig
from deploys.schema.control_readers import read_webhook_url
from deploys.schema.monitoring import MONITORING_GROUP, MonitoringHostKeys
from facts.containers import JsonRecord
from facts.host import FilesMatching, ManagedFiles, PrometheusReload
from files import helper_path

@operation()
def monitoring_host_removed():
    """A host no longer in the group `monitoring` runs no Prometheus or Alertmanager of the toolkit's."""
    changed = False
    for unit in (f"{PROMETHEUS}.service", f"{ALERTMANAGER}.service"):
        running, enabled = unit_state(host, unit)
        if running or enabled:
            changed = True
            yield StringCommand("systemctl", "disable", "--now", unit)
    present = [p for p, info in read(host, ManagedFiles, paths=HOST_FILES).items() if info is not None]
    if present:
        changed = True
        yield StringCommand("rm", "-f", *present)
    secrets = read(host, FilesMatching, directory=DIR, patterns=SCRAPE_SECRETS)
    if secrets:
        changed = True
        yield StringCommand("rm", "-f", *map(QuoteString, secrets))
    if not changed:
        host.noop("not the monitoring host")


def host_reads(batch: tuple[str, ...] = HOST_FILES) -> list:
    return [(ManagedFiles, {"paths": batch}), (FilesMatching, {"directory": DIR, "patterns": SCRAPE_SECRETS}),
            *service_reads(f"{PROMETHEUS}.service"),
            *service_reads(f"{ALERTMANAGER}.service"),
            *(r for u in DISTRO_UNITS.values()
              for r in ((Link, {"path": f"{UNIT_DIR}/{u}"}), *service_reads(u))),
            *follow_up_reads("prometheus-unit", "prometheus-reload", "alertmanager-unit")]


def loaded_path(unit: str, credential: str) -> str:
    """systemd's copy of a ``LoadCredential=`` file, made when the unit started: what the running program reads (a
    reload rereads this copy, so a changed file takes effect only by a restart)."""
    return f"/run/credentials/{unit}.service/{credential}"


def loaded_differs(loaded: dict[str, dict | None], contents: dict[str, str]) -> bool:
    """Whether a running unit's credential copies (``loaded``: ManagedFiles' answer by path) hold other bytes than
    ``contents`` (path -> what the deploy writes). No copy at all: the unit is not running (its start copies them);
    one missing among others, or one that differs: a hand edit that a restart loaded, or a write whose restart never
    ran. The follow-up's stamp cannot tell: it says only what a converge applied last."""
    if all(info is None for info in loaded.values()):
        return False
    return any(loaded.get(path) is None or loaded[path]["sha1"] != hashlib.sha1(text.encode()).hexdigest()
               for path, text in contents.items())


def loaded_paths(keys: dict[str, str]) -> tuple[dict[str, None], dict[str, str]]:
    """systemd's copies of Alertmanager's configuration and of each head's scrape key (``keys``: head -> key)."""
    return ({loaded_path(ALERTMANAGER, "alertmanager.yml"): None},
            {loaded_path(PROMETHEUS, scrape_key_id(h)): h for h in keys})


def planned_reads(inventory, name: str) -> list:
    """What the monitoring host's step reads while the run is planned (what its running units loaded): preflight reads
    them with its own facts, so this step, which comes before any release step (deploys/all.py), costs no command of
    its own. None on another host."""
    if monitoring_host_name(inventory) != name:
        return []
    configs = inventory_configs(inventory)
    me = monitoring_only_configs(inventory).get(name) or configs.get(name)
    return [] if me is None else [*loaded_reads(me, scrape_keys(configs, name)), (JsonRecord, {"path": SCRAPED})]


def known_nodes(configs: dict[str, NodeConfig], scraped: dict | None, prometheus_runs: bool) -> set[str]:
    """The monitored nodes the scrape configuration holds at the start of a run (``scraped``: the SCRAPED record;
    none yet: every monitored node where Prometheus runs already, as a toolkit from before the record left it, else
    none: a first converge; ``prometheus_runs`` from the reads the step makes anyway, so it costs no command). A node the inventory adds is not among them: its targets join once this run set up its metrics
    (monitoring_targets_added), so a first converge, which may sync a model for hours, never pages it as down."""
    monitored = {n for n, c in configs.items() if c.monitoring_enabled}
    hosts = (scraped or {}).get("hosts")
    hosts = hosts if isinstance(hosts, list) else None
    if hosts is None:
        return monitored if prometheus_runs else set()
    return monitored & set(hosts)


def known_now(me: MonitoringHostKeys, configs: dict[str, NodeConfig]) -> set[str]:
    """known_nodes from what the monitoring host says now (its SCRAPED record, whether Prometheus runs); both reads are
    among the step's expected ones."""
    return known_nodes(configs, read(host, JsonRecord, path=SCRAPED),
                       read(host, PrometheusReload, helper=RELOAD_CHECK, port=me.prometheus_port) != "down")


def host_batch(keys: dict[str, str]) -> tuple[str, ...]:
    """The monitoring host's files read in one batch: its own, the reload check, and each scraped head's key and CA."""
    return (*HOST_FILES, RELOAD_CHECK, *(scrape_key_path(h) for h in keys), *(ca_path(h) for h in keys))


def scraped_record(nodes: set[str]) -> str:
    return json.dumps({"hosts": sorted(nodes)}) + "\n"


def loaded_reads(me: MonitoringHostKeys, keys: dict[str, str]) -> list:
    """Prometheus's word on its last reload and the running units' loaded copies (``keys``: head -> scrape key)."""
    am_loaded, keys_loaded = loaded_paths(keys)
    return [*reload_reads(me), (ManagedFiles, {"paths": (*am_loaded, *keys_loaded)})]


def reload_reads(me: MonitoringHostKeys) -> list:
    """The running Prometheus's word on its last reload (read with the monitoring host's other reads)."""
    return [(PrometheusReload, {"helper": RELOAD_CHECK, "port": me.prometheus_port})]


SCRAPE_SECRETS = ("scrape-*.key", "ca-*.crt")  # the monitoring host's per-head files


@operation()
def stale_scrape_files_removed(keep: tuple[str, ...]):
    """The scrape key and CA of a head no longer scraped through its endpoint go (a key left behind is a secret left
    behind)."""
    stale = [p for p in read(host, FilesMatching, directory=DIR, patterns=SCRAPE_SECRETS) if p not in keep]
    if not stale:
        host.noop("no scrape key or CA of a head that is not scraped")
        return
    yield StringCommand("rm", "-f", *map(QuoteString, stale))


@deploy("Monitoring host")
def monitoring_host():
    """Prometheus and Alertmanager on the host of the group `monitoring`, scraping every monitored node. It comes
    before every release step of the run (deploys/all.py): pyinfra runs each operation on every host before the next,
    so the lab's scrape targets and rules change without waiting for any cluster's sync, switch or gate, and a
    monitoring host whose own release fails has updated them already."""
    watcher = monitoring_host_name(host.inventory)
    if watcher != host.name:
        expect(host_reads())
        monitoring_host_removed(name=f"No Prometheus here (not the host of the group {MONITORING_GROUP})")
        return
    me = host_config()  # an inference node's config, or a monitoring-only host's (MonitoringHostConfig)
    configs = inventory_configs(host.inventory)
    keys = scrape_keys(configs, watcher)
    batch = host_batch(keys)
    am_loaded, keys_loaded = loaded_paths(keys)
    expect([*host_reads(batch), *APT_READS, *loaded_reads(me, keys), (JsonRecord, {"path": SCRAPED})])  # (preflight's)
    known = known_now(me, configs)
    apt_lists_updated(name="Update apt lists when older than a day (waits for a held lock)", cache_time=86400)
    webhook = read_webhook_url(me.alertmanager_webhook_url_file) if me.alertmanager_webhook_url_file else None
    watchdog = read_webhook_url(me.alertmanager_watchdog_url_file) if me.alertmanager_watchdog_url_file else None
    ours = {"prometheus": PROMETHEUS, "prometheus-alertmanager": ALERTMANAGER, "prometheus-node-exporter": EXPORTER}
    for package in ("prometheus", "prometheus-alertmanager", "prometheus-node-exporter"):  # (an exporter a lab installs)
        distro_unit_masked(name=f"Mask the distribution's {DISTRO_UNITS[package]} (the toolkit runs its own unit)",
                           unit=DISTRO_UNITS[package], ours=f"{ours[package]}.service")
    packages_installed(name="Install Prometheus and Alertmanager from the distribution",
                       packages=["prometheus", "prometheus-alertmanager", "python3"],  # python3: the reload check
                       recommends=False)
    for head, key in keys.items():
        secret_file(name=f"Install the key Prometheus reads {head}'s vLLM metrics with (0600, never printed)",
                    src=StringIO(key + "\n"), dest=scrape_key_path(head), batch=batch, private_dir=False,
                    resets=follow_up_stamp("prometheus-unit"))
        if configs[head].endpoint_tls_ca:
            atomic_put(name=f"Install the CA {head}'s endpoint is checked with", src=configs[head].endpoint_tls_ca,
                       dest=ca_path(head), batch=batch)
    alertmanager_conf = render_alertmanager(me, webhook, watchdog)
    # each write below removes its follow-up's stamp: a hand edit that was loaded, then put right by this write,
    # is applied again (the stamp alone says the restored content was applied already)
    secret_file(name="Install Alertmanager's configuration (0600: the webhook URL may carry a token)",
                src=StringIO(alertmanager_conf), dest=ALERTMANAGER_CONF, batch=batch, private_dir=False,
                resets=follow_up_stamp("alertmanager-unit"))
    # the nodes it scrapes already (their labels as the inventory says now); a node new to it joins at the run's end
    conf = render_prometheus({n: c for n, c in configs.items() if n in known}, me, watcher)
    rules = render_rules(me)
    atomic_put(name="Install Prometheus's scrape configuration (from the inventory)", src=StringIO(conf),
               dest=PROMETHEUS_CONF, batch=batch, resets=follow_up_stamp("prometheus-reload"))
    atomic_put(name="Record the nodes Prometheus scrapes", src=StringIO(scraped_record(known)), dest=SCRAPED,
               batch=batch)
    atomic_put(name="Install the toolkit's alert rules", src=StringIO(rules), dest=RULES, batch=batch,
               resets=follow_up_stamp("prometheus-reload"))
    atomic_put(name="Install the Grafana dashboard (for a lab's Grafana to import)", src=StringIO(render_dashboard()),
               dest=DASHBOARD, batch=batch)
    units = {}
    for unit, text in ((PROMETHEUS, render_prometheus_unit(me, list(keys))), (ALERTMANAGER, render_alertmanager_unit(me))):
        path = f"{UNIT_DIR}/{unit}.service"
        units[unit] = (path, text)
        atomic_put(name=f"Install {unit}.service", src=StringIO(text), dest=path, batch=batch,
                   resets=follow_up_stamp(f"{unit.removeprefix('inference-nodes-')}-unit"))
    key_paths = tuple(scrape_key_path(h) for h in keys)
    path, text = units[PROMETHEUS]
    loaded = read(host, ManagedFiles, paths=(*am_loaded, *keys_loaded))
    follow_up_done(name="Apply Prometheus's unit and scrape keys (daemon-reload, restart)", stamp="prometheus-unit",
                   command=f"systemctl daemon-reload && systemctl restart {PROMETHEUS}.service",
                   paths=(path, *key_paths), contents=(text, *(keys[h] + "\n" for h in keys)),
                   needed=loaded_differs({p: loaded.get(p) for p in keys_loaded},
                                         {p: keys[h] + "\n" for p, h in keys_loaded.items()}))
    stale_scrape_files_removed(name="Remove the scrape keys and CAs of heads no longer scraped through an endpoint",
                               keep=tuple(scrape_key_path(h) for h in keys) + tuple(
                                   ca_path(h) for h in keys if configs[h].endpoint_tls_ca))
    path, text = units[ALERTMANAGER]
    follow_up_done(name="Apply Alertmanager's unit and configuration (daemon-reload, restart)", stamp="alertmanager-unit",
                   command=f"systemctl daemon-reload && systemctl restart {ALERTMANAGER}.service",
                   paths=(path, ALERTMANAGER_CONF), contents=(text, alertmanager_conf),
                   needed=loaded_differs({p: loaded.get(p) for p in am_loaded},
                                         {p: alertmanager_conf for p in am_loaded}))
    for unit in (ALERTMANAGER, PROMETHEUS):
        unit_running(name=f"Start and enable {unit}.service", unit=f"{unit}.service")
    atomic_put(name="Install the check that Prometheus loaded its files", src=helper_path("monitoring/prometheus_loaded.py"),
               dest=RELOAD_CHECK, mode="0644", batch=batch)
    # its files changed since the last reload that loaded them, or Prometheus says its last reload failed (a reload
    # by hand of a bad file, then a converge that put the file right again)
    follow_up_done(name="Reload Prometheus after a change of targets or rules (promtool checks them first)",
                   stamp="prometheus-reload", command=reload_command(me), paths=(PROMETHEUS_CONF, RULES),
                   contents=(conf, rules),
                   needed=read(host, PrometheusReload, helper=RELOAD_CHECK, port=me.prometheus_port) == "not-loaded")


RELOAD_CHECK = "/usr/local/lib/inference-nodes/prometheus_loaded.py"
RELOAD_WAIT_S = 30


def reload_command(me: MonitoringHostKeys) -> str:
    """Shell: promtool's check, the reload (a HUP: asynchronous, and `systemctl` says "Reloaded" whatever Prometheus
    makes of it), then Prometheus's own word that it loaded the files since; else the step fails with its error."""
    errors = (f"journalctl -u {PROMETHEUS}.service -n 50 --no-pager -o cat | grep -i 'error' | tail -n 3 >&2")
    return (f"t=$(date +%s) && /usr/bin/promtool check config {PROMETHEUS_CONF} && systemctl reload {PROMETHEUS}.service "
            f"&& {{ python3 {RELOAD_CHECK} {int(me.prometheus_port)} --since \"$t\" --wait {RELOAD_WAIT_S} || "
            f"{{ echo 'Prometheus did not load its files:' >&2; {errors}; exit 1; }}; }}")


def rendered_files(name: str, configs: dict[str, NodeConfig], watcher: str | None,
                   watcher_only: MonitoringHostKeys | None = None) -> dict[str, str]:
    """Node path -> content of every file this component writes on ``name`` (deploys/render.py); secrets named,
    never rendered. ``watcher_only``: the config of a monitoring-only ``watcher``, which ``configs`` (the inference
    nodes) does not hold."""
    cfg, out = configs.get(name), {}
    if cfg is not None and cfg.monitoring_enabled:
        out.update({FACTS_CONFIG: render_facts_config(name, cfg, watcher),
                    f"{UNIT_DIR}/{EXPORTER}.service": render_exporter_unit(cfg),
                    f"{UNIT_DIR}/{FACTS}.service": render_facts_service(),
                    f"{UNIT_DIR}/{FACTS}.timer": render_facts_timer(cfg)})
    if name == watcher:
        me = watcher_only or cfg
        keys = endpoint_scraped(configs, watcher)
        out.update({PROMETHEUS_CONF: render_prometheus(configs, me, watcher), RULES: render_rules(me),
                    SCRAPED: scraped_record({n for n, c in configs.items() if c.monitoring_enabled}),
                    DASHBOARD: render_dashboard(),
                    f"{UNIT_DIR}/{PROMETHEUS}.service": render_prometheus_unit(me, keys),
                    f"{UNIT_DIR}/{ALERTMANAGER}.service": render_alertmanager_unit(me),
                    ALERTMANAGER_CONF: "# not rendered: Alertmanager's route and alertmanager_webhook_url_file's URL (0600)\n"})
        for head in keys:
            out[scrape_key_path(head)] = f"# not rendered: {head}'s endpoint_metrics_client key (0600)\n"
    return out


def prometheus_url(cfg: MonitoringHostKeys) -> str:
    return f"http://127.0.0.1:{cfg.prometheus_port}"


@deploy("Monitoring host")
def monitoring_targets_added():
    """At the end of the run (deploys/all.py): the monitored nodes new to Prometheus join its scrape configuration, now
    that this run set up their metrics (their exporter and facts timer: node_metrics, the step before). Nothing on a
    run that adds no node, and nothing on another host than the monitoring host."""
    watcher = monitoring_host_name(host.inventory)
    if watcher != host.name:
        return
    me = host_config()
    configs = inventory_configs(host.inventory)
    keys = scrape_keys(configs, watcher)
    batch = host_batch(keys)
    expect([*host_reads(batch), *reload_reads(me), (JsonRecord, {"path": SCRAPED})])  # (read by monitoring_host already)
    known = known_now(me, configs)
    monitored = {n for n, c in configs.items() if c.monitoring_enabled}
    if not monitored - known:
        return
    conf, rules = render_prometheus(configs, me, watcher), render_rules(me)
    atomic_put(name=f"Add the scrape targets of {', '.join(sorted(monitored - known))} (their metrics set up by this run)",
               src=StringIO(conf), dest=PROMETHEUS_CONF, batch=batch, resets=follow_up_stamp("prometheus-reload"))
    atomic_put(name="Record the nodes Prometheus scrapes", src=StringIO(scraped_record(monitored)), dest=SCRAPED,
               batch=batch)
    follow_up_done(name="Reload Prometheus after a change of targets or rules (promtool checks them first)",
                   stamp="prometheus-reload", command=reload_command(me), paths=(PROMETHEUS_CONF, RULES),
                   contents=(conf, rules), needed=False)
