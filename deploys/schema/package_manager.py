"""Package manager keys (deploys/apt_state.py)."""

from __future__ import annotations

from deploys.schema.base import ComponentKeys, _key


class PackageManagerKeys(ComponentKeys):
    """apt and dpkg under real conditions (deploys/apt_state.py)."""

    apt_lock_timeout_s: int = _key(
        600,
        description="how long every apt/dpkg command waits for another package run (unattended-upgrades on "
        "first boot) to release its lock before the host fails, naming the holder",
        ge=0, le=86400,
    )
