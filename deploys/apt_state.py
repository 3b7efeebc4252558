"""apt and dpkg under real conditions: another package run holding the lock, and a dpkg run that was cut.

On a node's first boot unattended-upgrades (apt-daily-upgrade.service) holds the dpkg lock for minutes and
apt-daily.service holds the lists lock while it updates. Two mechanisms cover the two locks:

- installs: `DPkg::Lock::Timeout` in an apt.conf.d drop-in written before any apt command of the run, so
  every `apt-get install/remove` (pyinfra's and ours) waits up to `apt_lock_timeout_s` for
  /var/lib/dpkg/lock-frontend, printing apt's own "Waiting for cache lock: ... held by process N (name)".
- `apt-get update`, `apt-mark` and `dpkg --configure -a`: apt honours that option for the dpkg locks only,
  never for /var/lib/apt/lists/lock (measured: apt 2.6.2 on Debian 12 and 3.0.4 on trixie fail at once with
  "Could not get lock /var/lib/apt/lists/lock"; no changelog entry of apt 2.7, Ubuntu 24.04's, changes it),
  and dpkg has no wait of its own. These run through `lock_waiting` (deploys/ops.py), which retries while the
  failure is a held lock and gives up after the same timeout with a message naming the lock and its holder.

A node whose dpkg was interrupted (`dpkg --audit` not empty) is repaired with `dpkg --configure -a` before
anything else installs (apt refuses to install until then); the run logs it, naming the host.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, QuoteString, StringCommand, deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.facts.server import Date

from deploys.apt_sources import foreign_sources_disabled, sources_args
from deploys.run.reads import FactRead, expect, operation, read
from deploys.inventory import host_config
from deploys.schema import NodeConfig
from deploys.ops import atomic_put, lock_timeout, lock_waiting
from facts.apt import AptSourcesNaming
from facts.dpkg import DpkgAudit
from facts.host import ManagedFiles

LOCK_DROPIN = "/etc/apt/apt.conf.d/50inference-nodes-lock-timeout"
UPDATE_STAMP = "/var/lib/apt/periodic/update-success-stamp"  # where pyinfra's apt.update keeps cache_time

# what apt_lists_updated and pyinfra's apt.packages read
APT_READS: list[FactRead] = [(File, {"path": UPDATE_STAMP}), (Date, {}), (DebPackages, {})]


def render_lock_dropin(timeout: int) -> str:
    return ("// Managed by inference-nodes (deploys/apt_state.py): wait for another apt/dpkg run (unattended-\n"
            "// upgrades on first boot) to release the dpkg lock instead of failing at once.\n"
            f'DPkg::Lock::Timeout "{int(timeout)}";\n')


@operation()
def apt_lists_updated(cache_time: int | None = None):
    """`apt-get update`, waiting for a held lists lock; with ``cache_time``, skipped while the lists are
    younger than that (the stamp pyinfra's apt.update uses, so the two agree).

    + cache_time: seconds the lists count as fresh (None: always update)
    """
    if cache_time:
        stamp = read(host, File, path=UPDATE_STAMP)
        if stamp and stamp.get("mtime"):
            now = datetime.fromtimestamp(read(host, Date).timestamp(), timezone.utc).replace(tzinfo=None)
            if stamp["mtime"] > now - timedelta(seconds=cache_time):
                host.noop("apt lists are fresh")
                return
    yield lock_waiting("apt-get", "update", "-qq")
    if cache_time:
        yield StringCommand("mkdir", "-p", "/var/lib/apt/periodic", "&&", "touch", UPDATE_STAMP)


def _say_repair(state, host, problems: list[str]) -> bool:
    busy = any(p.startswith("Another process has locked the database") for p in problems)
    shown = [p for p in problems if not p.startswith(("Another process has locked", "modifying it, some"))]
    host.log_styled(f"dpkg was interrupted on {host.name} (dpkg --audit: {'; '.join(shown[:3])}): repairing with "
                    "dpkg --configure -a before anything else"
                    + (" once the package run now holding the dpkg lock has finished" if busy else ""),
                    fg="yellow", log_func=logger.warning)
    return True


@operation()
def dpkg_repaired():
    """`dpkg --configure -a` when `dpkg --audit` reports an interrupted run; then the audit must be empty."""
    problems = read(host, DpkgAudit)
    if not problems:
        host.noop("dpkg --audit reports nothing")
        return
    yield FunctionCommand(_say_repair, (problems,), {})
    yield lock_waiting("env", "DEBIAN_FRONTEND=noninteractive", "dpkg", "--force-confdef", "--force-confold",
                       "--configure", "-a")
    check = ('a=$(dpkg --audit 2>&1); [ -z "$a" ] || { echo "dpkg --configure -a did not repair dpkg; '
             'dpkg --audit still reports:" >&2; printf "%s\\n" "$a" >&2; exit 1; }')
    yield StringCommand("sh", "-c", QuoteString(check))


@deploy("Package manager")
def package_manager_ready():
    """First changes of a run: apt sources that would break apt beside the toolkit's own (deploys/apt_sources.py),
    the lock wait for every later apt command, then a consistent dpkg."""
    cfg = host_config()
    sources = sources_args(cfg) if isinstance(cfg, NodeConfig) else None  # (a monitoring-only host has no NVIDIA repo)
    expect([(ManagedFiles, {"paths": (LOCK_DROPIN,)}), (DpkgAudit, {}), *([(AptSourcesNaming, sources)] if sources else [])])
    if sources:
        foreign_sources_disabled(name="Disable other apt entries for the NVIDIA repos (entry by entry)", **sources)
    atomic_put(name="Wait for a held dpkg lock instead of failing (apt.conf.d)", src=StringIO(render_lock_dropin(lock_timeout())),
               dest=LOCK_DROPIN, user="root", group="root", mode="0644", create_remote_dir=False)
    dpkg_repaired(name="Finish an interrupted dpkg run (dpkg --configure -a)")
