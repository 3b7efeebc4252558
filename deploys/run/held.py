"""A release held back on the host being prepared, for this run (deploys/service/failed_release.py decides it: the
inventory asks for a release that failed here before). The steps that make a release (the image pull, the model
snapshot and its deep verify, the service) skip themselves while it is held; the endpoint and the node's metrics,
which converge as usual, point at the release that serves, whose API may differ from the one asked for. The same
for a run that only stages the release (`release_stage_only`: a rollout's first phase): everything converges but the
switch, and the endpoint and metrics stay in front of the release that serves."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyinfra.context import ctx_host

from deploys.run.state import keep, kept

if TYPE_CHECKING:
    from deploys.schema import NodeConfig

_HELD = "release held back"
API_KEYS = ("api_bind_address", "api_port", "engine_port")


def release_api_of(record: dict) -> dict:
    """The API keys a release's record holds (``API_KEYS``). A record from before the door has no engine port: that
    release's vLLM listened on the clients' port itself (engine_port = its api_port: no door in front of it)."""
    api = {k: record[k] for k in API_KEYS if record.get(k) is not None}
    if "api_port" in api and "engine_port" not in api:
        api["engine_port"] = api["api_port"]
    return api


def hold(why: str | None, served: dict | None = None) -> None:
    """Keep whether (``why``) the host's release is held back, and the served release's record (its API)."""
    keep(ctx_host.get(), _HELD, (why, served or {}) if why else None)  # the Host itself: `host` is one proxy for all


def release_held() -> str | None:
    """Why the release the inventory asks for is held back on the host being prepared (None: it is not)."""
    held = kept(ctx_host.get(), _HELD, lambda: None)
    return held[0] if held else None


_DEFERRED = "switch deferred"


def defer(served: dict | None) -> None:
    """Keep that this run stages the release the inventory asks for and leaves the switch to a later run
    (`release_stage_only`), with the served release's record (its API)."""
    keep(ctx_host.get(), _DEFERRED, served or {})


def switch_deferred() -> bool:
    """Whether the host being prepared stages its release only, this run (deploys/rollout/: the stage phase)."""
    return kept(ctx_host.get(), _DEFERRED, lambda: None) is not None


def as_served(cfg: NodeConfig) -> NodeConfig:
    """``cfg`` with the API of the release that serves where the one asked for is held back or only staged (else
    ``cfg``)."""
    held = kept(ctx_host.get(), _HELD, lambda: None)
    served = held[1] if held else kept(ctx_host.get(), _DEFERRED, lambda: None)
    api = release_api_of(served) if served else {}
    return cfg.model_copy(update=api) if api else cfg
