"""Operations shared by several components: per-host failure, verified apt keyrings, the apt/dpkg lock wait,
apt holds, and follow-up steps decided from state."""

from __future__ import annotations

import hashlib
import io
import posixpath
import shlex
import uuid

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory, File, FileContents, Link

from deploys.inventory import host_config
from facts.apt import AptHolds, KeyringFingerprints
from files import helper_text
from facts.host import ManagedFiles, SystemdNeedsReload
from deploys.run.reads import operation, read, run_on, unit_state


def flat_repo_source(header: str, uri: str, keyring: str) -> str:
    """A deb822 source for a flat apt repo (`Suites: /`, the layout NVIDIA's CUDA and toolkit repos use)."""
    return f"{header}Types: deb\nURIs: {uri.rstrip('/')}/\nSuites: /\nSigned-By: {keyring}\n"


def host_failed(host, message: str) -> bool:
    """Log ``message`` for ``host`` and return False: what a FunctionCommand's body returns to fail its host."""
    host.log_styled(message, fg="red", log_func=logger.error)
    return False


def uses_sudo(host) -> bool:
    """Whether pyinfra runs this host's commands under sudo, as pyinfra itself decides it: the host's `_sudo`
    data, else the command line's `--sudo` (its config). The toolkit's own privileged paths (private uploads,
    rsync's remote side, a member reached from another host's operation) follow the same answer."""
    value = getattr(host.data, "_sudo", _UNSET)  # as pyinfra's pop_global_arguments: any host value wins
    return bool(host.state.config.SUDO if value is _UNSET else value)


def sudo_args(host) -> dict:
    """The `_sudo` argument of a command the toolkit runs on ``host`` outside an operation (``run_on``)."""
    return {"_sudo": True} if uses_sudo(host) else {}


_UNSET = object()


def shown(command: StringCommand) -> FunctionCommand:
    """``command`` run with its output shown as it comes, without `-v`: a long step (a model sync, a full
    re-hash, an image pull) prints its own progress lines instead of minutes of silence. The command's progress
    lines must be few (files/model_snapshot/sync_progress.py: one every PROGRESS_EVERY_S seconds)."""
    return FunctionCommand(_shown, (command,), {})


def _shown(state, host, command: StringCommand) -> bool:
    ok, _ = run_on(host, command, print_output=True, **sudo_args(host))
    return ok


def fail_host(message: str) -> FunctionCommand:
    """A command that fails this host alone, with ``message``: the one way an operation fails a host (yield it;
    ``refuse`` at deploy level). Raising in an operation aborts every host."""
    return FunctionCommand(_fail_host, (message,), {})


def _fail_host(state, host, message: str) -> bool:
    return host_failed(host, message)


def cluster_all_here(state, host, cluster: str, members: list[str], change: str = "") -> bool:
    """Execute time: every other member of ``cluster`` is in this run and has not failed (the steps before the
    restart have run on all of them by now: operations run one at a time across hosts)."""
    others = [state.inventory.get_host(m) for m in members if m != host.name]
    failed = [m.name for m in others if m in state.failed_hosts]
    outside = [m.name for m in others if m not in state.failed_hosts and m not in state.active_hosts]
    if not failed and not outside:
        return True
    why = [f"{', '.join(failed)} failed earlier in this run"] if failed else []
    why += [f"{', '.join(outside)} {'is' if len(outside) == 1 else 'are'} not in this run (--limit, or unreachable)"] if outside else []
    return host_failed(host, f"{host.name}: the launch of cluster {cluster} changes{change}, but {' and '.join(why)}: no member's "
                             f"unit or model changes, and the cluster keeps serving its current launch. Converge the whole "
                             f"cluster once every member can take the change")


class ControlNodeError(RuntimeError):
    """The control node cannot provide what a host needs (its model download, the hub client's wheels): that
    host fails, with this message (fail_host, host_failed); the others go on."""


FOLLOW_UP_DIR = "/var/lib/inference-nodes/follow-ups"


def content_fingerprint(*contents: str) -> str:
    """sha256 of ``contents`` concatenated: what ``files_fingerprint_command`` prints on the node for files
    holding exactly those contents, in that order."""
    return hashlib.sha256("".join(contents).encode()).hexdigest()


def files_fingerprint_command(paths) -> str:
    """Shell command printing the fingerprint of ``paths`` as they are on the node now."""
    return f"cat {' '.join(shlex.quote(p) for p in paths)} | sha256sum | cut -d' ' -f1"


def follow_up_stamp(name: str) -> str:
    return f"{FOLLOW_UP_DIR}/{name}"


def follow_up_reads(*names: str) -> list[tuple]:
    """What follow_up_done reads for each stamp (deploys/run/reads.py expect)."""
    return [(FileContents, {"path": follow_up_stamp(name)}) for name in names]


@operation()
def follow_up_done(stamp: str, command, paths: tuple[str, ...], contents: tuple[str, ...], needed: bool = False):
    """Run ``command`` (the step that applies ``paths``: a rebuild, a re-exec, a restart) unless it already
    succeeded after they held ``contents``. Decided from state, never from the write's ``did_change``:
    the stamp holds the fingerprint of the files the command last succeeded after, written only once it
    succeeded, and the write removes it (``atomic_put(resets=...)``). So a run killed between the write and
    the follow-up, or a follow-up that failed, is completed by the next run (the service restart does the
    same with the unit's own start record: deploys/service/unit.py).

    + stamp: the stamp's name under FOLLOW_UP_DIR (one per follow-up)
    + command: shell command (a string or a StringCommand)
    + paths: the files the follow-up applies
    + contents: what the deploy writes to them
    + needed: the applied state says the command must run again whatever the stamp says (read from the node: a
      service that reports it did not load what its files hold)
    """
    path = follow_up_stamp(stamp)
    recorded = read(host, FileContents, path=path)
    if not needed and recorded and recorded[0].strip() == content_fingerprint(*contents):
        host.noop(f"done after the current {', '.join(paths)} ({path})")
        return
    yield command if isinstance(command, StringCommand) else StringCommand("sh", "-c", QuoteString(command))
    yield StringCommand("sh", "-c", QuoteString(follow_up_record_command(stamp, paths)))


def follow_up_record_command(stamp: str, paths: tuple[str, ...]) -> str:
    """Shell: record that ``stamp``'s follow-up succeeded after ``paths`` as they are now (run once it did: by
    follow_up_done, or by a step that applies the files itself). 0600: a fingerprint of files that hold secrets (a
    key, a webhook URL) is not for other users to test guesses on."""
    path = follow_up_stamp(stamp)
    return (f"umask 077 && mkdir -p {FOLLOW_UP_DIR} && {files_fingerprint_command(paths)} > {path}.tmp && "
            f"mv -f {path}.tmp {path}")


def _content_and_remote(src, dest: str, batch: tuple[str, ...]) -> tuple[bytes, dict | None]:
    """The bytes to write (``src``: a local path or a file-like object, rewound: an operation body runs again
    at execute time) and ``dest``'s owner, mode and sha1 on the node (read with the deploy's ``batch``)."""
    if hasattr(src, "read"):
        data = src.read()
        src.seek(0)
        data = data.encode() if isinstance(data, str) else data
    else:
        with open(src, "rb") as f:
            data = f.read()
    paths = tuple(batch) if dest in batch else (dest,)
    return data, read(host, ManagedFiles, paths=paths).get(dest)


def _holds(remote: dict | None, data: bytes, user: str, group: str, mode: str) -> bool:
    """Whether a file as ManagedFiles read it (None: none) holds ``data`` with this owner and mode."""
    return bool(remote) and (remote["sha1"], remote["user"], remote["group"], remote["mode"]) == (
        hashlib.sha1(data).hexdigest(), user, group, int(mode))


STAGE_DIR = "/var/lib/inference-nodes/staged"  # 0700 root


def staged_path(live: str) -> str:
    """Where a converge writes the unit or the service environment of a switch still ahead: out of systemd's reach
    (Quadlet reads UNIT_DIR at a daemon-reload, which apt or a person may run at any time; a start reads the env
    file), so an exit of the running release restarts that release, never the new one ungated behind an open door.
    The node's restart step puts them in place (deploys/service/unit.py ``staged_install_command``), after the door
    closed; the host tuning's fabric environment too."""
    return f"{STAGE_DIR}/{live.rsplit('/', 1)[-1]}"


def until_marker_command(path: str, seconds: int) -> str:
    """Shell: write ``path`` as ``{"until": <the node's clock now + seconds>}``, renamed into place: a marker that a
    converge writes for work it may not live to finish, which stops counting by itself at its bound (the switch
    marker, the model-upgrade marker). The path is the toolkit's own (no quoting needed); seconds an int."""
    return (f"mkdir -p {posixpath.dirname(path)} && printf '{{\"until\": %s}}\\n' \"$(( $(date +%s) + {int(seconds)} ))\" "
            f"> {path}.tmp && mv -f {path}.tmp {path}")


@operation()
def atomic_put(src, dest: str, user: str = "root", group: str = "root", mode: str = "0644",
               create_remote_dir: bool = True, batch: tuple[str, ...] = (), resets: str | None = None,
               same_as: str | None = None):
    """Like files.put, but a killed run never leaves a half-written file in place: the content is
    uploaded next to ``dest`` and renamed over it (pyinfra writes in place when it does not sudo).

    + src: a local path, or the content as a file-like object
    + dest: remote path
    + user, group, mode: ownership and permissions (mode as a string)
    + create_remote_dir: create the parent directory first (as files.put does)
    + batch: every file the calling deploy manages (``dest`` among them): their state is read in one
      round trip, once per run (deploys/run/reads.py)
    + resets: a follow-up stamp (``follow_up_stamp``) removed before ``dest`` is replaced, so the follow-up
      runs again even for content it applied before (a hand edit that was applied in between)
    + same_as: another file (in ``batch``) whose holding exactly this content, owner and mode makes the write
      unneeded: a staged copy of a live file (``staged_path``)
    """
    data, remote = _content_and_remote(src, dest, batch)
    if _holds(remote, data, user, group, mode):
        host.noop(f"{dest} is up to date")
        return
    if same_as and _holds(_content_and_remote(src, same_as, batch)[1], data, user, group, mode):
        host.noop(f"{same_as} holds it already")
        return
    tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.inference-nodes-tmp")
    if resets:
        yield StringCommand("rm", "-f", QuoteString(resets))
    if create_remote_dir:
        yield StringCommand("mkdir", "-p", QuoteString(posixpath.dirname(dest)))
    yield FileUploadCommand(io.BytesIO(data), tmp)
    yield StringCommand("chown", f"{user}:{group}", QuoteString(tmp), "&&", "chmod", mode, QuoteString(tmp),
                        "&&", "mv", "-f", QuoteString(tmp), QuoteString(dest))


@operation()
def refuse(message: str):
    """Fail this host with ``message`` (a precondition the inventory cannot meet).

    + message: what is wrong and how to fix it
    """
    yield fail_host(message)


@operation()
def keyring_verified(url: str, fingerprint: str, dest: str, resets: str | None = None):
    """Fetch an apt signing key on the node and install only the key with ``fingerprint``, refusing a file
    that holds any other primary key (files/apt/install_signing_key.sh). A keyring on the node that holds
    anything but that one primary key is replaced.

    + url: where the key is published (https:// or file://)
    + fingerprint: the full 40-hex fingerprint of its one primary key
    + dest: keyring path for ``Signed-By:``
    + resets: a follow-up stamp removed before the keyring is replaced (as ``atomic_put``'s)
    """
    if read(host, KeyringFingerprints, path=dest) == [fingerprint]:
        host.noop(f"{dest} holds key {fingerprint} alone")
        return
    if resets:
        yield StringCommand("rm", "-f", QuoteString(resets))
    yield StringCommand("sh", "-c", QuoteString(helper_text("apt/install_signing_key.sh")), "install_signing_key", QuoteString(url),
                        QuoteString(fingerprint), QuoteString(dest))


# $0: label, $1: timeout in seconds, $2...: the command. Retries only while the command fails on a held
# lock (apt: "Could not get lock ...", dpkg 1.22: "dpkg frontend lock was locked by /usr/bin/python3.13
# process with pid 2728", older dpkg: "... locked by another process"); any other outcome is the command's own.
LOCK_WAIT_SCRIPT = r"""t=$1; shift; end=$(( $(date +%s) + t )); said=
while :; do
  out=$("$@" 2>&1); rc=$?
  [ $rc -eq 0 ] && { [ -n "$out" ] && printf '%s\n' "$out"; exit 0; }
  case $out in
    *"Could not get lock"*|*"lock was locked by "*|*"locked by another process"*) ;;
    *) printf '%s\n' "$out" >&2; exit $rc;;
  esac
  held=$(printf '%s\n' "$out" | grep -m1 -i 'lock' | sed 's/^E: //')
  if [ "$(date +%s)" -ge "$end" ]; then
    echo "inference-nodes: gave up after ${t}s waiting for the apt/dpkg lock to run '$*': $held" >&2
    echo "inference-nodes: another package run (unattended-upgrades, apt-daily) still holds it; let it finish and rerun" >&2
    exit $rc
  fi
  [ -n "$said" ] || { echo "inference-nodes: waiting up to ${t}s for the apt/dpkg lock: $held" >&2; said=1; }
  sleep 2
done"""


def lock_timeout() -> int:
    """The host being prepared's `apt_lock_timeout_s`."""
    return host_config().apt_lock_timeout_s


def lock_waiting(*argv: str, timeout: int | None = None) -> StringCommand:
    """``argv`` run on the node, retried while another apt/dpkg run holds the lock it needs, for ``timeout``
    seconds (default: the host's `apt_lock_timeout_s`). Every word is quoted: package names come from the
    inventory and the node's package lists."""
    timeout = lock_timeout() if timeout is None else timeout
    return StringCommand("sh", "-c", QuoteString(LOCK_WAIT_SCRIPT), "lock-wait", str(int(timeout)),
                         *(QuoteString(a) for a in argv))


@operation()
def apt_held(packages: list[str]):
    """`apt-mark hold` each of ``packages`` that is not held yet.

    + packages: installed package names
    """
    held = set(read(host, AptHolds))
    missing = [p for p in packages if p not in held]
    if not missing:
        host.noop(f"{len(packages)} package(s) held")
        return
    yield lock_waiting("apt-mark", "hold", *missing)  # dpkg's selections: waits for a held dpkg lock


@operation()
def packages_installed(packages: list[str], recommends: bool = True):
    """Install each of ``packages`` that dpkg does not list as installed (apt-get, non-interactive, keeping
    configuration files a lab changed; the apt/dpkg lock wait comes from deploys/apt_state.py's drop-in).

    + packages: package names
    + recommends: install what they recommend too (apt's default); False where a recommended package would start
      a service of its own (Debian's prometheus recommends a node-exporter that listens on every address)
    """
    installed = read(host, DebPackages)
    missing = [p for p in packages if p not in installed]
    if not missing:
        host.noop(f"{', '.join(packages)} installed")
        return
    yield StringCommand("DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-o", "Dpkg::Options::=--force-confdef",
                        "-o", "Dpkg::Options::=--force-confold", *([] if recommends else ["--no-install-recommends"]),
                        *map(QuoteString, missing))


@operation()
def file_absent(path: str):
    """Remove the file at ``path`` where there is one (a directory there fails the host: not the toolkit's).

    + path: node path
    """
    info = read(host, File, path=path)
    if info is None:
        host.noop(f"{path} is absent")
        return
    if info is False:
        yield fail_host(f"{host.name}: {path} is not a file: leaving it for a person to look at")
        return
    yield StringCommand("rm", "-f", QuoteString(path))


@operation()
def directory_present(path: str, user: str = "root", group: str = "root", mode: str = "0755"):
    """A directory at ``path`` (and its parents) with this owner and mode.

    + path: node path
    + user, group, mode: ownership and permissions (mode as a string)
    """
    info = read(host, Directory, path=path)
    if info is False:
        yield fail_host(f"{host.name}: {path} exists and is not a directory")
        return
    if info is None:
        yield StringCommand("mkdir", "-p", QuoteString(path))
    if info is None or (info["user"], info["group"]) != (user, group):
        yield StringCommand("chown", f"{user}:{group}", QuoteString(path))
    if info is None or info["mode"] != int(mode):
        yield StringCommand("chmod", mode, QuoteString(path))
    if info is not None and (info["user"], info["group"], info["mode"]) == (user, group, int(mode)):
        host.noop(f"{path} is a directory ({user}:{group} {mode})")


@operation()
def units_loaded(units: list[str]):
    """Reload systemd when any of ``units`` changed on disk since it was loaded (systemd's own
    NeedDaemonReload): decided from state, so a run killed after writing a unit still reloads next time.

    + units: unit names
    """
    if not read(host, SystemdNeedsReload, units=tuple(units)):
        host.noop(f"systemd has loaded {', '.join(units)} as they are on disk")
        return
    yield StringCommand("systemctl", "daemon-reload")


@operation()
def unit_running(unit: str, running: bool | None = True, enabled: bool = True):
    """A system unit started (``running``; None: left as it is) and enabled at boot.

    + unit: systemd unit name, with its suffix
    + running: start it where it is not running
    + enabled: enable it where it is not enabled
    """
    is_running, is_enabled = unit_state(host, unit)
    if running and not is_running:
        yield StringCommand("systemctl", "start", QuoteString(unit))
    if enabled and not is_enabled:
        yield StringCommand("systemctl", "enable", QuoteString(unit))
    if (not running or is_running) and (not enabled or is_enabled):
        host.noop(f"{unit} is {'running and ' if running else ''}enabled")


def upload_private(src, dest: str):
    """The commands that upload ``src`` (a path or a file-like object) to ``dest`` without it ever lying in
    a file other users can read on the way (yield them from an operation).

    As root, SFTP writes ``dest`` itself. Under ``_sudo`` pyinfra uploads to a file in /tmp that SFTP
    creates 0644 and then `sudo cp`s it: here that file sits in a directory only the SSH user can enter,
    made by that user (mkdir fails on anything already there, a planted symlink included), removed after
    the copy (a killed run leaves it behind, still 0700).
    """
    if not uses_sudo(host):
        yield FileUploadCommand(src, dest)
        return
    private = f"/tmp/inference-nodes-upload-{uuid.uuid4().hex}"
    yield StringCommand("mkdir", "-m", "0700", private, _sudo=False)
    yield FileUploadCommand(src, dest, remote_temp_filename=f"{private}/secret")
    yield StringCommand("rm", "-rf", private, _sudo=False)


@operation()
def secret_file(src, dest: str, batch: tuple[str, ...] = (), private_dir: bool = True, resets: str | None = None,
                same_as: str | None = None):
    """Write a file that holds (or may hold) a secret: mode 0600 root, its content never printed (files.put
    would show it under --diff), never lying in a file other users can read on the way (under ``_sudo`` the
    upload passes only through a 0700 directory of the SSH user), and replaced whole: the content goes into a
    0600 file beside ``dest`` that is renamed over it, so a killed run leaves the old file or the new one.
    The one writer of every file whose values may be secrets (hub token, registry credentials, env files).

    + src: a control-node path, or the content as a file-like object
    + dest: node path
    + batch: as atomic_put's (the deploy's managed files, read in one round trip)
    + private_dir: make the parent directory 0700 (a directory of secrets); else only create it
    + resets: as atomic_put's (a follow-up stamp removed before ``dest`` is replaced)
    + same_as: as atomic_put's (a live file whose holding this content, 0600 root, makes the write unneeded)
    """
    data, remote = _content_and_remote(src, dest, batch)
    if _holds(remote, data, "root", "root", "0600"):
        host.noop(f"{dest} up to date (0600)")
        return
    if same_as and _holds(_content_and_remote(src, same_as, batch)[1], data, "root", "root", "0600"):
        host.noop(f"{same_as} holds it already (0600)")
        return
    parent, name = posixpath.split(dest)
    tmp = f"{parent}/.{name}.inference-nodes-tmp"
    if resets:
        yield StringCommand("rm", "-f", QuoteString(resets))
    if private_dir:
        yield StringCommand("install", "-d", "-m", "0700", "-o", "root", "-g", "root", QuoteString(parent))
    else:
        yield StringCommand("mkdir", "-p", QuoteString(parent))
    yield StringCommand("rm", "-f", QuoteString(tmp), "&&", "install", "-m", "0600", "-o", "root", "-g", "root",
                        "/dev/null", QuoteString(tmp))
    yield from upload_private(io.BytesIO(data), tmp)  # into the 0600 file made above
    yield StringCommand("chown", "root:root", QuoteString(tmp), "&&", "chmod", "0600", QuoteString(tmp), "&&",
                        "mv", "-f", QuoteString(tmp), QuoteString(dest))


@operation()
def distro_unit_masked(unit: str, ours: str):
    """A distribution package's own service masked before the package is installed (it never starts with the
    package's defaults, e.g. listening on every address), since the toolkit runs the program as its own unit
    ``ours``; a node where that service runs already fails instead (a lab's own service is not taken over).

    + unit: the package's unit (``nginx.service``)
    + ours: the toolkit's unit that runs the program instead
    """
    link = read(host, Link, path=f"/etc/systemd/system/{unit}")
    if link and link.get("link_target") == "/dev/null":
        host.noop(f"{unit} is masked")
        return
    running, _ = unit_state(host, unit)
    if running:
        yield fail_host(f"{host.name}: {unit} runs on this node already; the toolkit runs the program as its own unit "
                        f"({ours}). Stop and disable {unit} (or turn the toolkit's component off)")
        return
    yield StringCommand("systemctl", "mask", QuoteString(unit))
