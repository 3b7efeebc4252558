"""Model snapshot keys: what, at which commit, where on disk, how it gets there and is re-verified
(deploys/model/snapshot.py, deploys/model/integrity.py). The manifest and token files are read by
deploys/schema/control_files.py once the keys parse."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import model_validator

from deploys.schema.base import HEX40, ComponentKeys, ControlDir, ControlSecret, HubVenv, IpAddress, OwnedDir, Url, _key
from deploys.schema.base import KeyRuleError


class ModelKeys(ComponentKeys):
    """The model snapshot: what, at which commit, where on disk."""

    model_repo: str = _key(
        description="hub repository id (`org/name`)", pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$"
    )
    model_revision: str = _key(description="the pinned 40-hex commit of `model_repo` (never a branch or tag)")
    model_root: OwnedDir = _key(
        description="directory holding the snapshot: the HF cache root (`hf_cache`) or the files themselves (`plain`)"
    )
    model_layout: Literal["hf_cache", "plain"] = _key(
        "hf_cache",
        description="`hf_cache`: `<root>/hub/models--org--name/snapshots/<commit>`; `plain`: the files in `model_root`",
    )
    model_size_gb: float = _key(
        167.0,
        description="disk the complete snapshot needs (GB, 10^9 bytes); preflight checks free space against "
        "what the asked commit still misses (a new commit is synced beside the releases kept for a rollback: a "
        "`plain` directory holding another commit counts as nothing)",
        gt=0, le=100_000,
    )

    model_manifest: str | None = _key(
        None,
        description="trusted manifest: `files/manifests/<org>--<name>@<commit>.json` (committed after review) or an "
        "absolute control-node path; its repo/commit must be `model_repo`/`model_revision`",
    )
    model_sync_mode: Literal["hub", "push", "swarm", "present"] = _key(
        "push",
        description="`hub`: each node downloads with huggingface_hub; `push`: the control node downloads once, "
        "verifies, rsyncs what each node lacks; `swarm`: the control node downloads once and the nodes share the "
        "snapshot among themselves in a private BitTorrent swarm (many nodes: docs/model-snapshot.md); `present`: "
        "only verify",
    )
    model_hub_venv: HubVenv = _key(
        "/opt/inference-nodes/hub-venv",
        description="venv the `hub` mode manages on the node (the pinned huggingface_hub, wheels pushed from the "
        "control node)",
    )
    model_hub_endpoint: Url = _key("https://huggingface.co", description="hub URL (HF_ENDPOINT)",
                                   pattern=r"^https?://\S+$")
    model_hub_token_file: ControlSecret | None = _key(
        None, description="control-node file holding a hub token (outside the repo, 0600); never printed"
    )
    model_control_cache: ControlDir = _key(
        "/var/cache/inference-nodes/hub", description="control-node HF cache the `push` mode downloads into"
    )
    model_rsync_streams: int = _key(4, description="parallel rsync streams per node in `push` mode", ge=1, le=16)
    model_push_fanout: int = _key(
        2,
        description="`push` mode: nodes each holder feeds per wave; the control node feeds the first this many of a "
        "group, then every node holding a verified copy feeds this many more (node to node)",
        ge=1, le=16,
    )
    model_peer_address: str | None = _key(
        None,
        description="address this node serves its verified copy to peers on during a `push` fan-out "
        "(default: the SSH host; set a faster network that every node of the group can reach)",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.:-]*$",
    )
    model_peer_port: int = _key(873, description="TCP port of that transient read-only rsync daemon", ge=1, le=65535)
    model_swarm_seed: Literal["first", "control"] = _key(
        "first",
        description="`swarm` mode: who seeds. `first`: the control node pushes one copy to the group's first node, "
        "which seeds the others (the control node's uplink carries one copy); `control`: the control node seeds "
        "from its own copy (on `model_swarm_control_address`)",
    )
    model_swarm_control_address: IpAddress | None = _key(
        None,
        description="`swarm` mode with `model_swarm_seed: control`: the control node's address on the nodes' "
        "network, the one the seed binds to and the nodes' firewall lets in",
    )
    model_swarm_super_seed: bool = _key(
        False,
        description="`swarm` mode: the seed offers each node only pieces no other node holds yet (BitTorrent's "
        "initial seeding), so its uplink carries about one copy however many nodes join; slower to start, and "
        "slow with a single node (BENCHMARKS.md, \"Fleet distribution\")",
    )
    model_swarm_port: int = _key(
        6881, description="`swarm` mode: the TCP port every node's swarm listens on (its peer address only)",
        ge=1024, le=65535,
    )
    model_swarm_piece_mib: Literal[1, 2, 4, 8, 16, 32, 64] = _key(
        16, description="`swarm` mode: the torrent's piece size, MiB (the unit the engine checks and trades)"
    )
    model_swarm_stall_s: int = _key(
        600,
        description="`swarm` mode: a node whose swarm received nothing for this long (or stopped) is fed by the "
        "control node instead", ge=30, le=86400,
    )
    model_swarm_keep_seeding_h: int = _key(
        0,
        description="`swarm` mode: hours each node's swarm keeps seeding after it started (0: it stops once every "
        "node of the run verified its copy, and nothing listens afterwards)", ge=0, le=168,
    )
    model_verify_full: bool = _key(
        False,
        description="re-hash every file in this converge even when the stamp matches (`--data model_verify_full=true`); "
        "a node with no deep-verify record gets a full re-hash anyway",
    )
    model_deep_verify_every: Literal["daily", "weekly", "monthly"] = _key(
        "weekly",
        description="how often the node's timer (`inference-nodes-model-verify.timer`) re-hashes every file against "
        "the manifest; the audit fails when the last deep verify is older than this plus the window and 12 h",
    )
    model_deep_verify_at: str = _key(
        "03:00",
        description="start of the deep verify's window, node local time `HH:MM` (weekly: Sundays; monthly: the 1st)",
        pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$",
    )
    model_deep_verify_window_h: int = _key(
        4, description="the start is spread at random over this many hours, so a cluster's nodes do not all read "
        "at once (systemd `RandomizedDelaySec=`)", ge=0, le=23,
    )
    model_deep_verify_max_mbps: int | None = _key(
        500,
        description="read-rate cap of every full re-hash on the node (the deep verify timer's and a converge's own), "
        "MB/s, all threads; the deep verify's unit also caps the device with `IOReadBandwidthMax=` (the idle IO "
        "class does nothing under the `none` scheduler NVMe uses). 160 GB take ~5.5 min at 500. `null`: uncapped",
        ge=10, le=100_000,
    )
    model_upgrade_marker_h: int = _key(
        12, description="a converge that installs another commit's manifest marks the node (`/var/lib/inference-nodes/"
        "model-upgrade.json`) until its switch ends, and the scheduled deep verify skips its run while the mark counts "
        "(the live files are not the new manifest's yet); a converge killed before its switch stops it counting this "
        "many hours after it was written", ge=1, le=168,
    )
    model_deep_verify_on_mismatch: Literal["stop", "keep_serving"] = _key(
        "stop",
        description="a bad file found by the deep verify (it is named in the journal and the stamp removed): `stop` "
        "stops the service; `keep_serving` keeps serving what it loaded. Either way it cannot start again until a "
        "converge repairs the snapshot, and the converge restarts it",
    )

    @model_validator(mode="after")
    def _revision_is_commit(self) -> ModelKeys:
        if not HEX40.fullmatch(self.model_revision):
            raise KeyRuleError("model_revision", self.model_revision, "a 40-hex commit id (lower case)")
        return self

    @model_validator(mode="after")
    def _swarm_is_safe(self) -> ModelKeys:
        if self.model_sync_mode != "swarm":
            return self
        if self.model_layout != "plain":
            raise KeyRuleError("model_sync_mode", self.model_sync_mode, "`swarm` with `model_layout: plain` (the "
                               "swarm writes the files themselves; the `hf_cache` layout's links into blobs are "
                               "huggingface_hub's)")
        address = self.model_swarm_control_address
        if self.model_swarm_seed == "control" and address is None:
            raise KeyRuleError("model_swarm_control_address", address, "the control node's IP address on the nodes' "
                               "network (`model_swarm_seed: control` seeds from there)")
        if address is not None and (ipaddress.ip_address(address).is_unspecified
                                    or ipaddress.ip_address(address).is_multicast):
            raise KeyRuleError("model_swarm_control_address", address, "one address of the control node (the "
                               "seed listens there alone), not a wildcard or multicast")
        return self
