#!/usr/bin/env python3
"""Time to page: for each failure the node tier injects, seconds from the injection to the alert firing in
Prometheus and to its notification reaching a receiver (the sandbox's webhook listener on 127.0.0.1:9199, which
stands for the lab's alerts webhook at /alerts and for the outside dead man's switch at /watchdog), beside the
window the rules promise (the same expressions and `for:` that `promtool test rules` checks in the unit tier).
Not a test.

    python bench/time_to_page.py [--only NAME,...]

Needs `make demo`'s converged sandbox (Prometheus and Alertmanager on sandbox-a) and nothing else on port 9199.
Each drill puts back what it broke. Prints a table and ends with one line for automated checks:

    time_to_page: service_stopped_s=X engine_hung_s=H killed_converge_s=Y failed_reload_s=Z failing_webhook_s=W worker_reboot_s=V
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from deploys.inventory import inventory_configs, load_inventory  # noqa: E402
from deploys.monitoring.host import RULES  # noqa: E402
from deploys.endpoint import closed_flag_path  # noqa: E402
from deploys.service.door import switch_marker_command, switch_marker_path  # noqa: E402
from deploys.service.unit import served_model_name  # noqa: E402
from tests.node.conftest import INVENTORY, on_node  # noqa: E402
from tests.sandbox.webhook_listener import WebhookListener  # noqa: E402

CONFIGS = inventory_configs(load_inventory(INVENTORY))
MON = CONFIGS["sandbox-a"]  # the sandbox's monitoring host
PROM = f"http://127.0.0.1:{MON.prometheus_port}"


def _state(alertname: str, host: str | None, state: str) -> bool:
    with urllib.request.urlopen(f"{PROM}/api/v1/alerts", timeout=5) as r:
        alerts = json.load(r)["data"]["alerts"]
    return any(a["labels"].get("alertname") == alertname and a["state"] == state
               and (host is None or a["labels"].get("host") == host) for a in alerts)


def firing(alertname: str, host: str | None = None) -> bool:
    return _state(alertname, host, "firing")


def pending(alertname: str, host: str | None = None) -> bool:
    return _state(alertname, host, "pending")


def wait(condition, bound: float, step: float = 0.5) -> float | None:
    """Seconds until ``condition()`` held (None: not within ``bound``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound:
        try:
            if condition():
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(step)
    return None


def timed(listener: WebhookListener, alertname: str, host: str | None, bound: float, inject,
          path: str = "/alerts") -> tuple[float | None, float | None]:
    """(to firing, to received) for ``alertname``, counted from just before ``inject()`` (a command that returns
    once its failure is in place, e.g. a stopped unit, would hide its own duration). The alert must be quiet first:
    one already pending would shorten the figure."""
    if wait(lambda: not (firing(alertname, host) or pending(alertname, host)), 600, step=1) is None:
        raise SystemExit(f"time_to_page: {alertname} on {host} does not go quiet before the drill")
    t0, wall = time.monotonic(), time.time()
    inject()
    fired = wait(lambda: firing(alertname, host), bound)
    got = wait(lambda: any(a["status"] == "firing" and (host is None or a["labels"].get("host") == host)
                           for a in listener.received(alertname, path, since=wall)),
               max(1.0, bound - (time.monotonic() - t0)))
    return fired, None if got is None else time.monotonic() - t0


def resolved(alertname: str, host: str | None, bound: float = 600) -> None:
    wait(lambda: not firing(alertname, host), bound, step=1)


def service_stopped(listener):
    node, unit = "sandbox-a", f"{CONFIGS['sandbox-a'].container_name}.service"
    try:
        return timed(listener, "InferenceServiceDown", node, 300, lambda: on_node(node, f"systemctl stop --no-block {unit}"))
    finally:
        on_node(node, f"systemctl start {unit}")
        resolved("InferenceServiceDown", node)


def engine_hung(listener):
    """vLLM's engine stopped (SIGSTOP) while it holds a request: /health still answers, no token comes; the stream
    in flight is the request it holds. InferenceNotGenerating after its stall window and `for:`; the engine goes
    on (SIGCONT) after."""
    import threading

    node, cfg = "sandbox-a", CONFIGS["sandbox-a"]
    body = json.dumps({"model": served_model_name(cfg), "prompt": "Once", "max_tokens": 1900,
                       "ignore_eos": True, "stream": True}).encode()

    def stream():
        request = urllib.request.Request(f"http://127.0.0.1:{cfg.api_port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=3600) as r:
                while not done.is_set() and r.readline():
                    pass
        except OSError:
            pass

    def running() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{cfg.api_port}/metrics", timeout=5) as r:
            return any(line.startswith("vllm:num_requests_running") and float(line.split()[-1]) >= 1
                       for line in r.read().decode().splitlines())

    done = threading.Event()
    threading.Thread(target=stream, daemon=True).start()
    if wait(running, 60) is None:
        raise SystemExit("time_to_page: the stream never ran on sandbox-a")
    time.sleep(2)  # a step or two of it counted
    try:
        return timed(listener, "InferenceNotGenerating", node, 120 + MON.alert_not_generating_for_s + 300,
                     lambda: on_node(node, "pkill -STOP -f VLLM::EngineCore"))
    finally:
        on_node(node, "pkill -CONT -f VLLM::EngineCore")
        done.set()
        resolved("InferenceNotGenerating", node)


def killed_converge(listener):
    """What a converge killed after it closed a head's door leaves: the closed flag and a switch marker that counts
    `service_switch_lease_s` (and the drain) from its last renewal; EndpointClosed once the marker ran out."""
    node = "sandbox-b0"
    cfg = CONFIGS[node]
    try:
        return timed(listener, "EndpointClosed", node, cfg.service_switch_lease_s + cfg.endpoint_drain_s + 300,
                     lambda: on_node(node, f"{switch_marker_command(cfg, cfg.endpoint_drain_s)} && "
                                           f"touch {closed_flag_path(cfg)}"))
    finally:
        on_node(node, f"rm -f {closed_flag_path(cfg)} {switch_marker_path(cfg)}")
        resolved("EndpointClosed", node)


def failed_reload(listener):
    """A rules file Prometheus cannot load, and a reload signal straight to it (the unit's own reload checks first
    and refuses): it keeps the rules it had and says so."""
    node = "sandbox-a"
    on_node(node, f"cp -p {RULES} /run/time-to-page.rules")
    try:
        return timed(listener, "PrometheusConfigReloadFailed", node, 120,
                     lambda: on_node(node, f"echo 'groups: [' >> {RULES} && "
                                           "systemctl kill -s HUP --kill-whom=main inference-nodes-prometheus.service"))
    finally:
        on_node(node, f"mv -f /run/time-to-page.rules {RULES} && "
                      "systemctl kill -s HUP --kill-whom=main inference-nodes-prometheus.service")
        resolved("PrometheusConfigReloadFailed", node)


def failing_webhook(listener):
    """The alerts webhook answers 500 (an expired token); a service stops, its notification fails:
    AlertmanagerNotificationsFailing fires, and from then on the Watchdog is held back: the time given is to the
    last Watchdog the dead man's switch gets (it pages after its own silence window)."""
    node, unit = "sandbox-a", f"{CONFIGS['sandbox-a'].container_name}.service"
    listener.refused.add("/alerts")
    t0, wall = time.monotonic(), time.time()
    on_node(node, f"systemctl stop --no-block {unit}")
    try:
        fired = wait(lambda: firing("AlertmanagerNotificationsFailing"), 300)
        fired = None if fired is None else time.monotonic() - t0
        time.sleep(150)  # longer than the Watchdog's repeat: any Watchdog after the silence began would show
        watchdogs = [a["received"] for a in listener.alerts if a["path"] == "/watchdog" and a["received"] >= wall]
        last = max(watchdogs) - wall if watchdogs else 0.0
        return fired, last
    finally:
        listener.refused.discard("/alerts")
        on_node(node, f"systemctl start {unit}")
        resolved("InferenceServiceDown", node)
        resolved("AlertmanagerNotificationsFailing", None)


def worker_reboot(listener):
    """sandbox-b1 (the pair's worker) rebooted: its node-exporter is gone while it boots; whichever alert of the
    node reaches the receiver first (a boot shorter than alert_for_s pages nothing: said as such)."""
    node = "sandbox-b1"
    wall = time.time()
    subprocess.Popen(["tests/sandbox/node.sh", "ssh", node, "systemctl reboot"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    fired = wait(lambda: firing("NodeExporterDown", node), 300)
    time.sleep(5)
    got = sorted((a["received"] - wall, a["labels"].get("alertname")) for a in listener.alerts
                 if a["labels"].get("host") == node and a["status"] == "firing" and a["received"] >= wall)
    print(f"  worker_reboot: notified: {got}", flush=True)
    wait(lambda: not firing("NodeExporterDown", node), 600, step=1)
    return fired, (got[0][0] if got else None)


DRILLS = {  # name: (what, alert, window the rules promise, drill)
    "service_stopped": ("service stopped (sandbox-a)", "InferenceServiceDown",
                        f"facts {MON.monitoring_facts_interval_s} s + scrape {MON.prometheus_scrape_interval_s} s + "
                        f"for {MON.alert_for_s} s + group_wait {MON.alertmanager_group_wait_s} s", service_stopped),
    "engine_hung": ("vLLM's engine stopped while it holds a request (sandbox-a)", "InferenceNotGenerating",
                    f"stall 120 s + for {MON.alert_not_generating_for_s} s (+ scrape)", engine_hung),
    "killed_converge": ("converge killed with the door closed (sandbox-b0)", "EndpointClosed",
                        f"lease {CONFIGS['sandbox-b0'].service_switch_lease_s} s + drain "
                        f"{CONFIGS['sandbox-b0'].endpoint_drain_s} s + facts + scrape + for {MON.alert_for_s} s",
                        killed_converge),
    "failed_reload": ("Prometheus reload failed (sandbox-a)", "PrometheusConfigReloadFailed",
                      f"scrape {MON.prometheus_scrape_interval_s} s + evaluation (for 0) + group_wait", failed_reload),
    "failing_webhook": ("alerts webhook answers 500", "AlertmanagerNotificationsFailing; then the Watchdog held back",
                        "the failed notification's retries + scrape + evaluation (for 0); then no Watchdog",
                        failing_webhook),
    "worker_reboot": ("worker rebooted (sandbox-b1)", "NodeExporterDown (if the boot outlasts for)",
                      f"scrape {MON.prometheus_scrape_interval_s} s + for {MON.alert_for_s} s", worker_reboot),
}


def fmt(s: float | None) -> str:
    return "-" if s is None else f"{s:.0f} s"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(DRILLS))
    args = parser.parse_args(argv)
    names = args.only.split(",")
    results = {}
    with WebhookListener() as listener:
        wait(lambda: firing("Watchdog"), 60)
        for name in names:
            what, alert, window, drill = DRILLS[name]
            results[name] = drill(listener)
            print(f"  {name}: fired {fmt(results[name][0])}, received {fmt(results[name][1])}", flush=True)
    print("\n| failure injected | alert | fires after | reaches the receiver after | window of the rules |")
    print("|---|---|---|---|---|")
    for name in names:
        what, alert, window, _ = DRILLS[name]
        fired, received = results[name]
        print(f"| {what} | {alert} | {fmt(fired)} | {fmt(received)} | {window} |")
    print("time_to_page: " + " ".join(f"{n}_s={results[n][0]:.0f}" if results[n][0] is not None else f"{n}_s=none"
                                      for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
