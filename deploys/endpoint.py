"""The head's door and the authenticated TLS endpoint: nginx from the distribution on each cluster's head, in front
of a vLLM that stays on loopback on a port of its own (engine_port).

The door is on the address and port clients used to reach vLLM itself (api_bind_address:api_port: loopback, plain
HTTP, no key): every head has it, so a switch closes every head's API alike (a JSON 503 with `Retry-After` while
the release changes, never an answer from a release that has not passed the serving gate, and the requests in flight
drained first). With endpoint_enabled, the same nginx also serves the TLS endpoint below, with the same door.

Why nginx and not Caddy: nginx is in Ubuntu 24.04's *main* (Canonical's security support; DGX OS 7 is Ubuntu
24.04) and in Debian 12/13, at 1.22-1.26; Caddy is frozen at 2.6.2 (October 2022) in every distribution, sits in
Ubuntu's *universe*, and has no bearer-key check of its own. nginx gives everything the endpoint needs from its
standard modules: TLS, a `map` from the `Authorization` header to a client name, per-key `limit_req`, exact
routes, unbuffered proxying for server-sent events, and a graceful reload (old workers finish their streams).

What runs: the toolkit's own unit `inference-nodes-endpoint.service` (`nginx -c` the toolkit's config, `daemon
off`), not the distribution's `nginx.service`, which is masked before the package is installed so that it never
starts with Debian's default site (port 80 on every address). A head that already runs `nginx.service` fails
with a message instead: the endpoint does not take over a web server a lab uses.

The client keys live in one root-only file on the node (`clients.map`, 0600, included by nginx's master process as
root): never in a unit, a command line, a process listing, pyinfra's output or `--diff` (written by
``secret_file``). The access log names the client and never the key (its format has no header in it). Adding,
removing or rotating a client is an inventory change; a converge applies it with ``systemctl reload``
(``nginx -t`` first; a bad config leaves the running one serving), which does not cut streams already running.
"""

from __future__ import annotations

import ipaddress
from io import StringIO

from pyinfra import host
from pyinfra.api import StringCommand, deploy
from pyinfra.facts.files import Link

from deploys.inventory import node_config
from deploys.ops import (atomic_put, distro_unit_masked, follow_up_done, follow_up_reads, follow_up_stamp,
                         packages_installed, secret_file, unit_running)
from deploys.run.held import as_served
from deploys.run.reads import expect, operation, read, service_reads, unit_state
from deploys.schema import NodeConfig
from deploys.schema.control_readers import read_clients
from deploys.schema.endpoint import ENDPOINT_ROUTES
from deploys.unit_text import confined, unit_word
from files import helper_path
from facts.host import ManagedFiles

UNIT = "inference-nodes-endpoint"
UNIT_PATH = f"/etc/systemd/system/{UNIT}.service"
DIR = "/etc/inference-nodes/endpoint"  # 0700 root: the certificate's key and the client keys
CONF = f"{DIR}/nginx.conf"
CLIENTS_MAP = f"{DIR}/clients.map"
MONITOR_MAP = f"{DIR}/monitor.map"
CERT = f"{DIR}/tls.crt"
KEY = f"{DIR}/tls.key"
ACCESS_LOG = f"/var/log/{UNIT}/access.log"
LOGROTATE = f"/etc/logrotate.d/{UNIT}"
RELOAD = f"/usr/local/lib/inference-nodes/{UNIT}-reload.sh"  # files/endpoint/reload.sh
DISTRO_UNIT = "nginx.service"
DISTRO_MASK = f"/etc/systemd/system/{DISTRO_UNIT}"
RELOAD_STAMP = "endpoint-reload"
RESTART_STAMP = "endpoint-unit"
TLS_FILES = (CLIENTS_MAP, MONITOR_MAP, CERT, KEY)  # the TLS endpoint's alone (endpoint_enabled)
FILES = (CONF, *TLS_FILES, LOGROTATE, RELOAD)

def url_host(address: str) -> str:
    """An IP address as the host part of a URL or a listen address (IPv6 in brackets)."""
    return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address


def render_maps(cfg: NodeConfig, clients: dict[str, str]) -> tuple[str, str]:
    """The two `map` bodies: `Authorization` value -> client name, for the clients and for the monitoring one.
    nginx compares a map's plain strings ignoring case, so each key is a case-sensitive regular expression, every
    character that is not a letter or digit in a class of its own (no escape for nginx's parser or PCRE to read).
    Names and keys are checked (read_clients): no quote, space, `;` or `$` reaches the file."""
    def pattern(key: str) -> str:
        return "".join(c if c.isalnum() else f"[{c}]" for c in key)

    def lines(pairs):
        return "".join(f'"~^[Bb]earer[ ]{pattern(key)}$" "{name}";\n' for name, key in pairs)

    header = "# inference-nodes: client keys (generated from endpoint_clients_file; 0600 root)\n"
    monitor = [(n, k) for n, k in clients.items() if n == cfg.endpoint_metrics_client]
    return header + lines((n, k) for n, k in clients.items() if n != cfg.endpoint_metrics_client), header + lines(monitor)


UPSTREAM_IDLE_S = 4  # how long nginx keeps an idle connection to vLLM (uvicorn closes its own after 5 s)
RETRY_AFTER_S = 30  # what a client is told to wait after a rate or upstream refusal, and at a closed door that cannot
# tell how long its switch may still take (no earlier switch timed, or this one ran past it)
# What a closed door may tell instead, rounded up to one of these: at most 60 s (the door tells again then; the OpenAI
# clients ignore a longer Retry-After and fall back to their own 0.5-8 s backoff), at least 5 s
RETRY_AFTER_STEPS = (5, 10, 15, 20, 30, 45, 60)


def error_body(status: int, kind: str, message: str) -> str:
    """An OpenAI-style error (`{"error": {"message", "type", "code"}}`) as nginx returns it: one single-quoted
    string, so no quote and no `$` (nginx would read a variable) in ``message``."""
    assert "'" not in message and "$" not in message and '"' not in message
    return f'{{"error": {{"message": "{message}", "type": "{kind}", "code": {status}}}}}'


CLOSED_BODY = error_body(503, "service_unavailable", "the service is switching to another release; try again shortly")
# What nginx answers itself, each as OpenAI clients read an error (they show the message, not only the status)
REFUSALS = {
    401: ("authentication_error", "a valid API key is required: Authorization: Bearer <your key>"),
    404: ("not_found_error", "no such route on this endpoint"),
    405: ("invalid_request_error", "this route does not take that method"),
    413: ("invalid_request_error", "the request body is larger than this endpoint takes"),
    429: ("rate_limit_error", "too many requests for this key; slow down and retry"),
    502: ("service_unavailable", "the inference service does not answer; try again shortly"),
    504: ("service_unavailable", "the inference service did not answer in time"),
}


def refusal(status: int) -> str:
    return f"return {status} '{error_body(status, *REFUSALS[status])}';"


CLOSED_DIR = "/var/lib/inference-nodes-endpoint"  # 0755 root: nginx's workers (www-data) must see into it


def closed_flag_path(cfg: NodeConfig) -> str:
    """While this file exists, the endpoint answers every API route with a JSON 503 (`Retry-After`): a converge
    creates it before it restarts the head and removes it once a release passed the serving gate (persistent: a
    reboot in between keeps the door closed until a converge gates what runs)."""
    return f"{CLOSED_DIR}/{cfg.container_name}.closed"


def retry_hint_path(cfg: NodeConfig, seconds: int) -> str:
    """While the door is closed, the file among these that exists says what its `Retry-After` tells (none: 30 s): how
    long the switch may still take, kept by the converge while it waits (deploys/service/door.py ``retry_after_s``)."""
    return f"{CLOSED_DIR}/{cfg.container_name}.retry-after-{seconds}"


def retry_hint_paths(cfg: NodeConfig) -> tuple[str, ...]:
    return tuple(retry_hint_path(cfg, s) for s in RETRY_AFTER_STEPS)


ANONYMOUS = "/__inference_nodes_anonymous"  # the internal location every request without a valid key goes through


def _methods(method: str) -> str:
    return "(GET|HEAD)" if method == "GET" else f"({method})"


def _proxy(cfg: NodeConfig) -> str:
    """How a door passes requests on to vLLM: unbuffered both ways (streams arrive as generated), kept-alive
    connections, the endpoint's timeouts."""
    return f"""        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_buffering off;
        proxy_cache off;
        proxy_request_buffering off;
        proxy_read_timeout {cfg.endpoint_read_timeout_s}s;
        proxy_send_timeout {cfg.endpoint_send_timeout_s}s;
        client_body_timeout {cfg.endpoint_send_timeout_s}s;
        send_timeout {cfg.endpoint_send_timeout_s}s;
        default_type application/json;  # what nginx answers itself (the closed door's JSON); vLLM's own types pass
"""


CLOSED = "/__inference_nodes_closed"  # the internal location every API request goes to while the door is closed


def _closed(cfg: NodeConfig) -> str:
    return f"if (-f {closed_flag_path(cfg)}) {{ rewrite ^ {CLOSED} last; }}"


def _closed_location(cfg: NodeConfig) -> str:
    """The closed door's answer: the JSON 503, with the `Retry-After` its hint file says (checked only while the door
    is closed)."""
    hints = "".join(f"            if (-f {retry_hint_path(cfg, s)}) {{ set $door_retry_after {s}; }}\n"
                    for s in RETRY_AFTER_STEPS if s != RETRY_AFTER_S)
    return f"""        location = {CLOSED} {{
            internal;
            set $door_retry_after {RETRY_AFTER_S};
{hints}            add_header Retry-After $door_retry_after always;
            return 503 '{CLOSED_BODY}';
        }}
"""


def render_loopback_door(cfg: NodeConfig) -> str:
    """The door where clients on the head reach the API today (api_bind_address:api_port, plain HTTP, no key, as
    vLLM itself was): every route passed on to vLLM, except while the door is closed for a switch, when every route
    but `/health` and `/metrics` answers the closed door's JSON 503 with `Retry-After` (a client never gets an answer
    from a release that has not passed the gate)."""
    return f"""
    # the door on the clients' own address and port: what reached vLLM itself before (no key: loopback)
    server {{
        listen {url_host(cfg.api_bind_address)}:{cfg.api_port};
        access_log {ACCESS_LOG} door;
        client_max_body_size 0;  # vLLM's own limits apply, as before the door
{_proxy(cfg)}
        location = /health {{ proxy_pass http://vllm; }}
        location = /metrics {{ proxy_pass http://vllm; }}
        location / {{
            {_closed(cfg)}
            proxy_pass http://vllm;
        }}
{_closed_location(cfg)}
        error_page 502 @unreachable;
        error_page 504 @too_slow;
        location @unreachable {{ add_header Retry-After {RETRY_AFTER_S} always; {refusal(502)} }}
        location @too_slow {{ {refusal(504)} }}
    }}
"""


def render_tls_endpoint(cfg: NodeConfig) -> str:
    """The authenticated TLS endpoint (endpoint_enabled): the listed routes for keyed clients, `/metrics` for the
    monitoring key, rate and in-flight limits per key, the closed door's JSON 503, OpenAI-style errors."""
    routes = "".join(
        f"""
        location = {route} {{
            if ($endpoint_client = "") {{ rewrite ^ {ANONYMOUS} last; }}
            {_closed(cfg)}
            if ($request_method !~ ^{_methods(ENDPOINT_ROUTES[route])}$) {{ add_header Allow "{ENDPOINT_ROUTES[route]}" always; {refusal(405)} }}
            limit_req zone=endpoint_clients burst={cfg.endpoint_rate_burst} nodelay;
            limit_conn endpoint_inflight {cfg.key_concurrency};
            proxy_pass http://vllm;
        }}
""" for route in cfg.endpoint_routes)
    return f"""
    server {{
        listen {url_host(cfg.endpoint_address)}:{cfg.endpoint_port} ssl;
        ssl_certificate {CERT};
        ssl_certificate_key {KEY};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:endpoint_tls:1m;
        access_log {ACCESS_LOG} endpoint;

        client_max_body_size {cfg.endpoint_max_body_mb}m;
{_proxy(cfg)}        proxy_set_header Authorization "";
{routes}
        location = /health {{
            if ($endpoint_client = "") {{ rewrite ^ {ANONYMOUS} last; }}
            if ($request_method !~ ^(GET|HEAD)$) {{ add_header Allow "GET" always; {refusal(405)} }}
            proxy_pass http://vllm;
        }}

        location = /metrics {{
            if ($endpoint_monitor = "") {{ rewrite ^ {ANONYMOUS} last; }}
            if ($request_method !~ ^(GET|HEAD)$) {{ add_header Allow "GET" always; {refusal(405)} }}
            proxy_pass http://vllm;
        }}

        location / {{
            {refusal(404)}
        }}
{_closed_location(cfg)}
        # a request without a valid key: counted per address (a `return` would answer before any limit applies), then
        # 401 from the try-files phase, which comes after the limits
        location = {ANONYMOUS} {{
            internal;
            limit_req zone=endpoint_anonymous burst=10 nodelay;
            try_files /nonexistent =401;
        }}
        error_page 401 @unauthenticated;
        location @unauthenticated {{ add_header WWW-Authenticate Bearer always; {refusal(401)} }}

        # what nginx itself refuses or cannot reach, as JSON too (vLLM's own errors pass through as they are)
        error_page 413 @too_large;
        error_page 429 @rate_limited;
        error_page 502 @unreachable;
        error_page 504 @too_slow;
        location @too_large {{ {refusal(413)} }}
        location @rate_limited {{ add_header Retry-After {RETRY_AFTER_S} always; {refusal(429)} }}
        location @unreachable {{ add_header Retry-After {RETRY_AFTER_S} always; {refusal(502)} }}
        location @too_slow {{ {refusal(504)} }}
    }}
"""


def render_conf(cfg: NodeConfig) -> str:
    """nginx's whole configuration for a head's door: the loopback door on the clients' port (``has_door``: not
    while a release from before the door serves on that port itself) and, with endpoint_enabled, the TLS endpoint.
    Every value is a validated number, address or route."""
    keyed = f"""
    map $http_authorization $endpoint_client {{
        default "";
        include {CLIENTS_MAP};
    }}
    map $http_authorization $endpoint_monitor {{
        default "";
        include {MONITOR_MAP};
    }}
    # the client's name, never its key: no header is logged
    log_format endpoint '$remote_addr $endpoint_client$endpoint_monitor [$time_iso8601] "$request_method $uri" '
                        '$status $body_bytes_sent $request_time';

    limit_req_zone $endpoint_client zone=endpoint_clients:1m rate={cfg.endpoint_rate_per_minute}r/m;
    limit_req_zone $binary_remote_addr zone=endpoint_anonymous:1m rate={cfg.endpoint_anonymous_per_minute}r/m;
    limit_conn_zone $endpoint_client zone=endpoint_inflight:1m;
    limit_req_status 429;
    limit_conn_status 429;
""" if cfg.endpoint_enabled else ""
    servers = ((render_loopback_door(cfg) if cfg.has_door else "")
               + (render_tls_endpoint(cfg) if cfg.endpoint_enabled else ""))
    return f"""# inference-nodes: the head's door (generated from the inventory; a converge replaces it). No key is in this file.
daemon off;
user www-data;
worker_processes auto;
pid /run/{UNIT}/nginx.pid;
error_log stderr warn;

events {{
    worker_connections 1024;
}}

http {{
    server_tokens off;
    types {{ application/json json; }}
    default_type application/octet-stream;
    client_body_temp_path /var/cache/{UNIT}/body;
    proxy_temp_path /var/cache/{UNIT}/proxy;
    fastcgi_temp_path /var/cache/{UNIT}/fastcgi;
    uwsgi_temp_path /var/cache/{UNIT}/uwsgi;
    scgi_temp_path /var/cache/{UNIT}/scgi;
    log_format door '$remote_addr [$time_iso8601] "$request_method $uri" $status $body_bytes_sent $request_time';
{keyed}
    upstream vllm {{
        server {url_host(cfg.engine_address)}:{cfg.engine_port};
        keepalive 16;
        keepalive_timeout {UPSTREAM_IDLE_S}s;  # below vLLM's own 5 s: nginx never reuses a connection vLLM is closing
    }}
{servers}}}
"""


def render_unit(cfg: NodeConfig) -> str:
    """The door's unit: nginx as the master (root: it binds the ports and reads the keys) with workers as
    www-data, started after its config checks, reloaded gracefully, confined to what it writes."""
    nginx = f"/usr/sbin/nginx -e stderr -c {CONF}"  # -e: not the build's default error log (read-only here)
    return f"""# inference-nodes: the head's door in front of the vLLM API (deploys/endpoint.py)
[Unit]
Description=inference-nodes door: the API's port (and the TLS endpoint) in front of vLLM on loopback
After=network-online.target {unit_word(cfg.container_name + ".service")}
Wants=network-online.target

[Service]
Type=exec
ExecStartPre={nginx} -t -q
ExecStart={nginx}
ExecReload=/bin/sh {RELOAD} $MAINPID {CONF}
KillSignal=SIGQUIT
TimeoutStopSec=30
Restart=on-failure
RestartSec=5
RuntimeDirectory={UNIT}
CacheDirectory={UNIT}
LogsDirectory={UNIT}
LogsDirectoryMode=0750
{confined("CAP_NET_BIND_SERVICE CAP_SETUID CAP_SETGID CAP_CHOWN CAP_KILL")}
[Install]
WantedBy=multi-user.target
"""


def render_logrotate() -> str:
    """The access log rotated weekly, four kept; nginx reopens its log on USR1 (no restart, no cut stream)."""
    return (f"# inference-nodes: the endpoint's access log (deploys/endpoint.py)\n{ACCESS_LOG} {{\n    weekly\n"
            f"    rotate 4\n    compress\n    delaycompress\n    missingok\n    notifempty\n    create 0640 root adm\n"
            f"    postrotate\n        systemctl kill -s USR1 --kill-whom=main {UNIT}.service 2>/dev/null || true\n"
            f"    endscript\n}}\n")


def endpoint_reads(cfg: NodeConfig) -> list:
    """What the door's operations read on this node (deploys/run/reads.py expect)."""
    here = [(ManagedFiles, {"paths": (*FILES, UNIT_PATH)}), *service_reads(f"{UNIT}.service")]
    if not cfg.is_head:
        return here
    return [*here, (Link, {"path": DISTRO_MASK}), *service_reads(DISTRO_UNIT), *follow_up_reads(RELOAD_STAMP, RESTART_STAMP)]


@operation()
def endpoint_removed():
    """A node that is no longer a head keeps no door: its unit stopped and disabled, its files gone (the
    distribution's nginx package stays, masked)."""
    running, enabled = unit_state(host, f"{UNIT}.service")
    present = [p for p, info in read(host, ManagedFiles, paths=(*FILES, UNIT_PATH)).items() if info is not None]
    if running or enabled:
        yield StringCommand("systemctl", "disable", "--now", f"{UNIT}.service")
    if present:
        yield StringCommand("rm", "-f", *present)
    if not (present or running or enabled):
        host.noop("no door on this node")


@operation()
def tls_endpoint_files_removed():
    """An endpoint turned off on a head: its certificate, key and client keys leave the node (the door stays on the
    clients' loopback port; the reload that follows stops the TLS listener)."""
    on_node = read(host, ManagedFiles, paths=(*FILES, UNIT_PATH))  # (the read the endpoint expects: no extra command)
    present = [p for p in TLS_FILES if on_node.get(p) is not None]
    if present:
        yield StringCommand("rm", "-f", *present)
    else:
        host.noop("no TLS endpoint files on this node")


@deploy("Endpoint")
def endpoint():
    """The door on every head (nginx on the clients' API port in front of vLLM's own port), with the cluster's
    authenticated TLS endpoint where endpoint_enabled; nothing on a worker."""
    cfg = as_served(node_config())  # in front of the release that serves (one asked for may be held back)
    expect(endpoint_reads(cfg))
    batch = (*FILES, UNIT_PATH)
    if not cfg.is_head:
        endpoint_removed(name="No door on this node (not the head)")
        return
    distro_unit_masked(name=f"Mask the distribution's {DISTRO_UNIT} (the endpoint runs its own unit)", unit=DISTRO_UNIT,
                       ours=f"{UNIT}.service")
    packages_installed(name="Install nginx from the distribution", packages=["nginx"])
    conf = render_conf(cfg)
    tls: tuple[tuple[str, str, str], ...] = ()
    if cfg.endpoint_enabled:
        clients_map, monitor_map = render_maps(cfg, read_clients(cfg.endpoint_clients_file))
        with open(cfg.endpoint_tls_cert, encoding="utf-8") as f:
            cert = f.read()
        with open(cfg.endpoint_tls_key, encoding="utf-8") as f:
            key = f.read()
        tls = ((CERT, cert, "certificate"), (KEY, key, "private key"), (CLIENTS_MAP, clients_map, "client keys"),
               (MONITOR_MAP, monitor_map, "monitoring key"))
    else:
        tls_endpoint_files_removed(name="No TLS endpoint on this head (endpoint_enabled is off): its keys leave")
    for dest, content, what in (*tls, (CONF, conf, "nginx configuration")):
        secret_file(name=f"Install the endpoint's {what} (0600, never printed)", src=StringIO(content), dest=dest,
                    batch=batch)
    atomic_put(name="Install the endpoint's reload (returns once the new configuration serves)",
               src=helper_path("endpoint/reload.sh"), dest=RELOAD, mode="0755", batch=batch)
    atomic_put(name="Rotate the endpoint's access log (logrotate)", src=StringIO(render_logrotate()), dest=LOGROTATE,
               batch=batch)
    unit = render_unit(cfg)
    atomic_put(name=f"Install {UNIT}.service", src=StringIO(unit), dest=UNIT_PATH, batch=batch,
               resets=follow_up_stamp(RESTART_STAMP))
    follow_up_done(name="Apply the endpoint's unit (daemon-reload, restart)", stamp=RESTART_STAMP,
                   command=f"systemctl daemon-reload && systemctl restart {UNIT}.service", paths=(UNIT_PATH,),
                   contents=(unit,))
    unit_running(name=f"Start and enable {UNIT}.service", unit=f"{UNIT}.service")
    follow_up_done(name="Reload the endpoint after a change of keys, certificate or routes (graceful: streams go on)",
                   stamp=RELOAD_STAMP, command=f"systemctl reload {UNIT}.service",
                   paths=(*(dest for dest, _, _ in tls), CONF), contents=(*(text for _, text, _ in tls), conf))


def endpoint_url(cfg: NodeConfig) -> str:
    """What a client calls: the endpoint's base URL."""
    return f"https://{url_host(cfg.endpoint_address)}:{cfg.endpoint_port}"

