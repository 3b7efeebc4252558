"""Rollout keys (deploys/rollout/): how a lab-wide rollout treats this node's cluster."""

from __future__ import annotations

from deploys.schema.base import ComponentKeys, _key


class RolloutKeys(ComponentKeys):
    """A rollout's choices per cluster (the same on every member: deploys/schema/cross_host.py)."""

    rollout_canary: bool = _key(
        False, description="this cluster is in a rollout's canary wave, which switches before every other cluster "
        "(e.g. one cluster per hardware class); none marked = the inventory's first cluster",
    )
    release_stage_only: bool = _key(
        False, description="this run stages the release the inventory asks for beside the live one (image pulled, "
        "model synced and verified, unit and environment staged and checked with the image's vLLM) and leaves the "
        "switch (door, restart, gate) to a later run: a rollout's first phase (`--data release_stage_only=true`)",
    )
