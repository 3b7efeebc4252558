"""Endpoint keys: one authenticated TLS endpoint per cluster, on its head, in front of a vLLM that stays on
loopback (deploys/endpoint.py). The control-node files (certificate, key, client keys) are checked by
deploys/schema/control_files.py once the keys parse; an endpoint on a worker by deploys/schema/cross_host.py."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import model_validator

from deploys.schema.base import ComponentKeys, ControlFile, ControlSecret, IpAddress, _key
from deploys.schema.base import KeyRuleError

# The vLLM routes a lab may open through the endpoint; every other path is refused (404). /health is answered
# to any client with a valid key; /metrics only to the monitoring client (endpoint_metrics_client).
ENDPOINT_ROUTES = {
    "/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET", "/v1/responses": "POST",
    "/v1/embeddings": "POST", "/tokenize": "POST", "/detokenize": "POST",
}
DEFAULT_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/models"]
CLIENT_KEY_MIN_LENGTH = 32  # characters of a client's bearer key (python -m deploys.endpoint_ca makes 43)


class EndpointKeys(ComponentKeys):
    """The authenticated TLS endpoint on each cluster's head (deploys/endpoint.py): distribution nginx."""

    endpoint_enabled: bool = _key(
        False, description="serve the cluster's API to the LAN through an authenticated TLS endpoint on its head (nginx "
        "from the distribution); vLLM stays on loopback. Off: the API is on loopback only",
    )
    endpoint_address: IpAddress | None = _key(
        None, description="address the endpoint listens on: one of the head's own addresses (checked by preflight), "
        "never a wildcard; required when `endpoint_enabled`",
    )
    endpoint_port: int = _key(8443, description="port the endpoint listens on", ge=1, le=65535)
    endpoint_tls_cert: ControlSecret | None = _key(
        None, description="control-node PEM certificate (chain) the endpoint presents (outside the repo, mode 0600); "
        "`python -m deploys.endpoint_ca` makes a lab CA and one; required when `endpoint_enabled`",
    )
    endpoint_tls_key: ControlSecret | None = _key(
        None, description="control-node PEM private key of `endpoint_tls_cert` (outside the repo, mode 0600); copied "
        "to the node 0600, never printed",
    )
    endpoint_tls_ca: ControlFile | None = _key(
        None, description="control-node CA certificate clients verify the endpoint with (the audit and the demo use "
        "it; the monitoring host gets a 0644 copy): PEM certificates only, no private key, the issuer of "
        "`endpoint_tls_cert`; unset = the system's trust store",
    )
    endpoint_clients_file: ControlSecret | None = _key(
        None, description="control-node file of client keys, one `name key` per line (`#` comments; names "
        f"`[a-z0-9][a-z0-9_.-]*`, keys of {CLIENT_KEY_MIN_LENGTH}+ characters `[A-Za-z0-9._~+/=-]`; outside the "
        "repo, mode 0600); the access log names the client, never the key; required when `endpoint_enabled`",
    )
    endpoint_metrics_client: str | None = _key(
        None, description="the client of `endpoint_clients_file` whose key reads `/metrics` (and nothing else: the "
        "monitoring scrape); unset = `/metrics` is refused to everyone", pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$",
    )
    endpoint_routes: list[Literal[tuple(ENDPOINT_ROUTES)]] = _key(  # type: ignore[valid-type]
        DEFAULT_ROUTES, description="vLLM routes the clients may use (each with its one method); every other path is "
        "refused. `/health` is answered to any client key",
    )
    endpoint_read_timeout_s: int = _key(
        3600, description="longest wait for vLLM between two reads of a response (a 32,768-token generation at 10 "
        "tok/s takes ~55 min without streaming)", ge=60, le=86400,
    )
    endpoint_send_timeout_s: int = _key(
        3600, description="longest wait between two writes to a client or to vLLM (slow clients, long prompts)",
        ge=60, le=86400,
    )
    endpoint_max_body_mb: int = _key(
        64, description="largest request body, MiB (a 1,048,576-token prompt is ~4-8 MiB of JSON)", ge=1, le=4096,
    )
    endpoint_rate_per_minute: int = _key(
        600, description="requests a client key may make per minute (beyond the burst: HTTP 429)", ge=1, le=1_000_000,
    )
    endpoint_key_concurrency: int | None = _key(
        None, description="requests one client may have in flight at once (beyond: HTTP 429), so one client cannot "
        "hold every sequence the engine runs: below the engine's sequences (`--max-num-seqs` of vllm_args, or "
        "MAX_NUM_SEQS of service_env) where the profile sets them. Unset = one below them (at least 1), or 4 where "
        "the profile does not say", ge=1, le=10_000,
    )
    endpoint_anonymous_per_minute: int = _key(
        60, description="requests without a valid key one address may make per minute before they get 429 instead "
        "of 401 (a burst of 10 above it)", ge=1, le=1_000_000,
    )
    endpoint_drain_s: int = _key(
        120, description="a switch (a converge's restart of the head) first closes the endpoint to new API requests "
        "(JSON 503 with `Retry-After`), then waits this long at most for the requests in flight to finish before the "
        "restart; it opens again once a release passed the serving gate", ge=0, le=3600,
    )
    endpoint_rate_burst: int = _key(
        60, description="requests a client key may make at once above its rate (nginx's `burst`: at least 1)", ge=1,
        le=100_000,
    )

    @model_validator(mode="after")
    def _endpoint_rules(self) -> EndpointKeys:
        if not self.endpoint_enabled:
            return self
        for key in ("endpoint_address", "endpoint_tls_cert", "endpoint_tls_key", "endpoint_clients_file"):
            if getattr(self, key) is None:
                raise KeyRuleError(key, None, "a value, since endpoint_enabled is true"
                                   + ("; make a lab CA, a certificate and client keys with `python -m deploys.endpoint_ca`"
                                      if key != "endpoint_address" else ""))
        address = ipaddress.ip_address(self.endpoint_address)
        if address.is_unspecified or address.is_multicast:
            raise KeyRuleError("endpoint_address", self.endpoint_address,
                               "one address of the head (not a wildcard: the endpoint listens where the inventory says)")
        if self.endpoint_routes != list(dict.fromkeys(self.endpoint_routes)):
            raise KeyRuleError("endpoint_routes", self.endpoint_routes, "each route once")
        return self
