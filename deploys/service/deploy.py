"""Inference service: the `@deploy` that installs the unit and its helpers, creates the persistent JIT/tmp
directories, and starts workers (rank > 0) before heads; it restarts a running service only when what it started
from changed, so a converge leaves a healthy service alone. A converge that starts or restarts one ends only once it
serves (deploys/service/switch.py); the head records the release it passed with (deploys/service/release.py).
"""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra.api import deploy
from pyinfra.facts.files import Directory, Sha256File
from pyinfra.facts.systemd import SystemdStatus

from deploys.endpoint import closed_flag_path
from deploys.host_tuning import render_fabric_env
from deploys.inventory import cluster_member_names, node_cluster, node_config
from deploys.model.snapshot import GATE, MANIFEST, render_gate
from deploys.ops import atomic_put, directory_present, follow_up_reads, secret_file, staged_path
from deploys.run.held import release_held, switch_deferred
from deploys.run.reads import expect
from deploys.schema import NodeConfig
from deploys.service.launch_check import args_check_command, vllm_accepts
from deploys.service.prune import prune_reads, releases_pruned
from deploys.service.release import gate_record_path, release_of
from deploys.service.restart import (cluster_changes_whole, door_closed_for_the_switch, model_release_switched,
                                     service_current, service_files_placed, started_from_reads, switch_marked)
from deploys.service.backoff import backoff_reads, backoff_reset_installed
from deploys.service.switch import service_serving, switch_left_for_later, switch_leftovers
from deploys.service.unit import (
    ARGS_CHECK,
    JOB_PROBE,
    QUADLET_STAMP,
    ROCE_GID,
    ROCE_HELPER,
    UNIT_DIR,
    fingerprint,
    render_container,
    render_service_env,
    served_model_name,
    service_env_path,
    started_from_path,
    vllm_argv,
)
from facts.containers import GatePassed, ReleasesOnDisk, ServiceStartedFrom
from facts.host import ExistingPaths, ManagedFiles
from files import helper_path


@deploy("Inference service")
def inference_service():
    cfg: NodeConfig = node_config()
    if release_held():  # a release that failed here: the service stays on the one it serves (deploys/run/held.py)
        return
    cluster = node_cluster()
    head, nodes = cluster.head, cluster.size
    unit_text = render_container(cfg, head, nodes, cluster.members)
    unit_path = f"{UNIT_DIR}/{cfg.container_name}.container"
    env_path = service_env_path(cfg)
    live = (unit_path, env_path, cfg.fabric_env_file)  # what a start reads (the fabric env: staged by host tuning)
    refs_main = f"{cfg.model_dir}/refs/main" if cfg.model_layout == "hf_cache" else None
    batch = (ROCE_HELPER, ROCE_GID, ARGS_CHECK, JOB_PROBE, *live, *map(staged_path, live), MANIFEST, GATE,
             *([refs_main] if refs_main else []))  # one round trip
    service = f"{cfg.container_name}.service"
    started = started_from_path(cfg)
    volume_dirs = [p for p in (cfg.jit_cache_dir, cfg.container_tmp_dir) if p]
    expect([(ManagedFiles, {"paths": batch}), *[(Directory, {"path": p}) for p in volume_dirs],
            (Sha256File, {"path": unit_path}), *follow_up_reads(QUADLET_STAMP), (SystemdStatus, {"services": [service]}),
            (ServiceStartedFrom, started_from_reads(started)),
            *([(GatePassed, {"record": gate_record_path(cfg), "service": service})] if cfg.is_head else []),
            (ExistingPaths, {"paths": switch_leftovers(cfg, cfg.is_head)}),
            (ReleasesOnDisk, prune_reads(cfg)), *backoff_reads()])
    atomic_put(batch=batch, name="Install the RoCE GID lookup", src=helper_path("inference_service/roce_gid.py"),
              dest=ROCE_HELPER, user="root", group="root", mode="0755", create_remote_dir=True)
    atomic_put(batch=batch, name="Install its start-time wrapper",
              src=StringIO(f"#!/bin/sh\nexec python3 {ROCE_HELPER} \"$@\" --sysfs {cfg.roce_sysfs_root}\n"),
              dest=ROCE_GID, user="root", group="root", mode="0755")
    atomic_put(batch=batch, name="Install the vLLM command-line check", src=helper_path("inference_service/check_vllm_args.py"),
              dest=ARGS_CHECK, user="root", group="root", mode="0644", create_remote_dir=True)
    atomic_put(batch=batch, name="Install the multi-node job probe", src=helper_path("inference_service/job_probe.py"),
              dest=JOB_PROBE, user="root", group="root", mode="0644", create_remote_dir=True)
    for path in volume_dirs:
        directory_present(name="Create the persistent JIT cache and tmp directories", path=path,
                        user="root", group="root", mode="0755")
    check = args_check_command(cfg, vllm_argv(cfg, head, nodes)) if cfg.vllm_launch == "cli" else None
    vllm_accepts(name="Check the new command line with the image's own vLLM", unit_path=unit_path,
                 unit_text=unit_text, check=check)
    members = cluster_member_names()
    cluster_changes_whole(name="Change a multi-node cluster only as a whole", unit_path=unit_path, unit_text=unit_text,
                          cluster=cfg.cluster_name, members=members)
    env_text = render_service_env(cfg, head, nodes)
    fp = fingerprint(unit_text, cfg, head, nodes)
    record = gate_record_path(cfg)
    # written beside the live files, out of systemd's reach (deploys/ops.py staged_path), when they differ
    secret_file(batch=batch, name="Stage the new service environment (0600, never printed)", src=StringIO(env_text),
                dest=staged_path(env_path), same_as=env_path)
    atomic_put(batch=batch, name="Stage the new Quadlet unit", src=StringIO(unit_text), dest=staged_path(unit_path),
               user="root", group="root", mode="0644", create_remote_dir=True, same_as=unit_path)
    staged = tuple((path, hashlib.sha256(text.encode()).hexdigest())
                   for path, text in zip(live, (unit_text, env_text, render_fabric_env(cfg))))
    if switch_deferred():  # a rollout's stage phase: the switch is a later run's (deploys/run/held.py)
        switch_left_for_later(name="Leave the switch to a later run (release_stage_only)", release=release_of(cfg, fp))
        return
    service_files_placed(name="Put the unit and environment in place (now, or at the restart once the door closed)",
                         service=service, started_from=started, fingerprint=fp, staged=staged, batch=batch)
    if cfg.is_head:
        switch_marked(name="Mark the switch before it starts (heads and single nodes)", service=service,
                      started_from=started, fingerprint=fp)
    if cfg.is_head:
        door_closed_for_the_switch(name="Close the door to new requests before a restart", service=service,
                                       started_from=started, fingerprint=fp, flag=closed_flag_path(cfg))
    # the model release: switched behind the door, with the start gate and refs/main of the commit it serves now
    model_release_switched(name="Switch the live model release to the new commit (staged and verified beside it)",
                           batch=batch)
    atomic_put(batch=batch, name="Install the model start gate", src=StringIO(render_gate(cfg.snapshot_dir)),
               dest=GATE, user="root", group="root", mode="0755", create_remote_dir=True)
    if refs_main:
        atomic_put(batch=batch, name="Write refs/main (offline loads, cache tools)", src=StringIO(cfg.model_revision),
                   dest=refs_main, user="root", group="root", mode="0644", create_remote_dir=True)
    service_current(name="Start or update workers (rank > 0) before heads", service=service, started_from=started,
                    fingerprint=fp, record=record, act=not cfg.is_head, staged=staged)
    service_current(name="Start or update heads and single nodes", service=service, started_from=started,
                    fingerprint=fp, record=record, act=cfg.is_head, staged=staged)
    service_serving(name="Wait until it serves (heads: /health and the serving gate)", service=service,
                    started_from=started, fingerprint=fp, release=release_of(cfg, fp), record=record,
                    head=cfg.is_head, workers=tuple(members[1:]) if cfg.is_head else (),
                    model=served_model_name(cfg))
    backoff_reset_installed(cfg)
    releases_pruned(name=f"Prune releases beyond the newest {cfg.releases_kept} (model commits, images)",
                    **prune_reads(cfg))
