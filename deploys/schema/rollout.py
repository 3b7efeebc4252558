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
    roll_back_from: str | None = _key(
        None, description="what a `deploys/roll_back.py` run takes its clusters off: release ids (16 hex digits, "
        "comma-separated; default: the release the inventory asks for). A head that serves one of them goes back to "
        "the good release it served before, workers first, gated (a rollout's `--abort`: `--data roll_back_from=ID,ID`)",
        pattern=r"^[0-9a-f]{16}(,[0-9a-f]{16})*$",
    )
