"""apt and dpkg under real conditions, and secrets, on a sandbox node.

- another package run holding the dpkg and lists locks (unattended-upgrades on first boot): the converge
  waits for it and completes;
- a dpkg run left interrupted: the next converge repairs it first, says so, and leaves `dpkg --audit` empty.
"""

from __future__ import annotations

import time

import pytest

from tests.node.conftest import INVENTORY, changed_operations, on_node, pyinfra

NODE = "sandbox-b1"
HOLD_S = 20

# fcntl locks, as apt and dpkg take them (flock(1) takes another kind, which apt would not notice)
HOLDER = """import fcntl, os, sys, time
fds = [os.open(p, os.O_RDWR | os.O_CREAT) for p in
       ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")]
for fd in fds:
    fcntl.lockf(fd, fcntl.LOCK_EX)
open("/run/apt-locks-held", "w").write(str(time.time()))
time.sleep(float(sys.argv[1]))
open("/run/apt-locks-released", "w").write(str(time.time()))
"""


APT_INSTALLS = ("Model snapshot | Install what the verifier and rsync need",
                "Container runtime | Install Podman from the distribution",
                "Container runtime | Install what fetching and checking repo keys needs")


@pytest.fixture(scope="module")
def converged(sandbox):
    pyinfra(INVENTORY, "deploys/all.py", "--limit", NODE)
    return NODE


def _apt_changes(proc) -> list:
    """What a converge changed through apt or dpkg (other files may be edited while these tests run;
    test_10 checks that the whole second converge is clean)."""
    return [(name, hosts) for name, hosts in changed_operations(proc)
            if name.startswith("Package manager |") or "apt lists" in name or name in APT_INSTALLS]


def _hold_locks(seconds: float) -> None:
    """The dpkg and lists locks held on the node for ``seconds`` by another process, from now on."""
    _ok("rm -f /run/apt-locks-held /run/apt-locks-released; "
        f"systemd-run --unit=test-hold-apt-locks --collect python3 -c '{HOLDER}' {seconds}")
    for _ in range(50):
        if on_node(NODE, "test -e /run/apt-locks-held").returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError("the lock holder did not start")


def _ok(command: str) -> str:
    proc = on_node(NODE, command)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return proc.stdout


def test_converge_waits_for_a_held_dpkg_lock_and_completes(converged):
    # something to install and lists to update once the locks are free
    _ok("apt-get remove -y -qq rsync >/dev/null && touch -d '2 days ago' /var/lib/apt/periodic/update-success-stamp")
    _hold_locks(HOLD_S)
    assert "Could not get lock" in on_node(NODE, "apt-get install -y -o DPkg::Lock::Timeout=0 rsync").stderr
    t0 = time.monotonic()
    proc = pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", NODE)
    took = time.monotonic() - t0
    changed = dict(changed_operations(proc))
    released = float(_ok("cat /run/apt-locks-released"))
    held = float(_ok("cat /run/apt-locks-held"))
    assert released - held >= HOLD_S - 1
    assert took >= HOLD_S - 5, f"the converge took {took:.0f} s: it did not wait for the lock"
    assert changed["Model snapshot | Install what the verifier and rsync need"] == [NODE]
    assert any(name.endswith("Update apt lists when older than a day (waits for a held lock)") for name in changed)
    # rsync was installed after the locks were released: dpkg logged it then
    installed_at = _ok("grep ' install rsync:' /var/log/dpkg.log | tail -1 | cut -d' ' -f1,2")
    assert float(_ok(f"date -d '{installed_at.strip()}' +%s")) >= int(released)
    assert _ok("dpkg-query -W -f='${Status}' rsync") == "install ok installed"
    assert _apt_changes(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", NODE)) == []


@pytest.mark.lifecycle
@pytest.mark.pair
def test_a_lock_held_past_apt_lock_timeout_s_fails_the_host_naming_the_lock(converged):
    """The worker (sandbox-b1) gives up on a held lock after apt_lock_timeout_s and fails naming it. Then, the lock
    still held, its head restarts its unchanged release in the same run (its service was stopped): a worker that
    failed an earlier step kept its service as it was, so the head does not count it: its restart passes the gate,
    nothing is remembered as failed, and the next converge runs as usual (issue 51 N1)."""
    head, failed = "sandbox-b0", "/var/lib/inference-nodes/inference.failed-release.json"
    _ok("touch -d '2 days ago' /var/lib/apt/periodic/update-success-stamp")  # an apt-get update is due
    _hold_locks(300)
    try:
        t0 = time.monotonic()
        proc = pyinfra(INVENTORY, "deploys/all.py", "--limit", NODE, "--data", "apt_lock_timeout_s=4", check=False)
        took = time.monotonic() - t0
        assert proc.returncode != 0
        out = proc.stdout + proc.stderr
        assert "inference-nodes: gave up after 4s waiting for the apt/dpkg lock to run '" in out, out[-3000:]
        assert "Could not get lock /var/lib/" in out
        assert took < 50, f"the run took {took:.0f} s: it did not give up after apt_lock_timeout_s"
        assert 'DPkg::Lock::Timeout "4";' in _ok("cat /etc/apt/apt.conf.d/50inference-nodes-lock-timeout")
        remembered = {n: on_node(n, f"cat {failed} 2>/dev/null").stdout for n in (head, NODE)}
        assert on_node(head, "systemctl stop inference.service").returncode == 0
        pair = pyinfra(INVENTORY, "deploys/all.py", "--limit", "gb10_dspark", "--data", "apt_lock_timeout_s=4",
                       check=False)
        assert pair.returncode != 0 and "gave up after 4s waiting for the apt/dpkg lock" in pair.stderr
        assert on_node(NODE, "test -e /run/apt-locks-released").returncode == 1, "the lock went before the run ended"
        assert f"[{head}] passed the serving gate (" in pair.stderr, pair.stderr[-4000:]
        assert "failed its switch" not in pair.stderr and "rolled back" not in pair.stderr, pair.stderr[-4000:]
        after = {n: on_node(n, f"cat {failed} 2>/dev/null").stdout for n in (head, NODE)}
        # (a release that passes forgets the head's old record: gone, or as it was, never a new one)
        assert all(after[n] in ("", remembered[n]) for n in after), \
            f"a worker's failure before its switch was remembered as a failed release: {after}"
    finally:
        on_node(NODE, "systemctl stop test-hold-apt-locks 2>/dev/null")
    pyinfra(INVENTORY, "deploys/all.py", "--limit", NODE)  # the default again, and the update it missed
    assert 'DPkg::Lock::Timeout "600";' in _ok("cat /etc/apt/apt.conf.d/50inference-nodes-lock-timeout")


def test_an_interrupted_dpkg_is_repaired_first_and_the_run_says_so(converged):
    pkg = "inference-nodes-interrupted"
    _ok(f"d=$(mktemp -d); mkdir $d/DEBIAN; printf 'Package: {pkg}\\nVersion: 1\\nArchitecture: all\\n"
        f"Maintainer: sandbox <sandbox@localhost>\\nDescription: unpacked, never configured\\n' > $d/DEBIAN/control; "
        f"dpkg-deb -b $d /tmp/{pkg}.deb >/dev/null && dpkg --unpack /tmp/{pkg}.deb >/dev/null")
    assert pkg in _ok("dpkg --audit")
    try:
        _hold_locks(10)  # and another package run still under way: the repair waits for it
        t0 = time.monotonic()
        proc = pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", NODE)
        assert time.monotonic() - t0 >= 8
        assert float(_ok("cat /run/apt-locks-released")) - float(_ok("cat /run/apt-locks-held")) >= 9
        assert f"dpkg was interrupted on {NODE} (dpkg --audit:" in proc.stderr
        assert "repairing with dpkg --configure -a before anything else" in proc.stderr
        changed = changed_operations(proc)
        assert changed[0] == ("Package manager | Finish an interrupted dpkg run (dpkg --configure -a)", [NODE])
        assert _ok("dpkg --audit") == ""
        assert _ok(f"dpkg-query -W -f='${{Status}}' {pkg}") == "install ok installed"
        again = pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", NODE)
        assert _apt_changes(again) == []
        assert "dpkg was interrupted" not in again.stderr
    finally:
        on_node(NODE, f"systemctl stop test-hold-apt-locks 2>/dev/null; dpkg --purge {pkg} >/dev/null 2>&1; "
                      f"rm -f /tmp/{pkg}.deb")


# --- secrets ------------------------------------------------------------------------------------------
# Runs on the node while a secret is uploaded: every /tmp entry pyinfra or the deploy makes for an upload,
# with its mode and owner, and whatever this process could read from it (the tests run it as root, which
# sees everything, and as nobody, an unrelated local user).
WATCHER = """import json, os, stat
seen, read = {}, []
while not os.path.exists("/run/watch-stop"):
    for e in os.scandir("/tmp"):
        if not e.name.startswith(("pyinfra-", "inference-nodes-upload-")):
            continue
        paths = [e.path]
        try:
            if e.is_dir(follow_symlinks=False):
                paths += [os.path.join(e.path, n) for n in os.listdir(e.path)]
        except OSError:
            pass
        for p in paths:
            try:
                st = os.lstat(p)
            except OSError:
                continue
            seen.setdefault(p, [oct(st.st_mode & 0o7777), st.st_uid, stat.S_ISDIR(st.st_mode)])
            if stat.S_ISREG(st.st_mode):
                try:
                    with open(p) as f:
                        data = f.read()
                except OSError:
                    continue
                if data and data not in read:
                    read.append(data)
print(json.dumps({"seen": seen, "read": read}))
"""
SUDO_USER = "deployer"


@pytest.fixture(scope="module")
def sudo_user(converged):
    """A non-root SSH user with passwordless sudo on the node (the sandbox inventory itself connects as root)."""
    import base64

    script = base64.b64encode(WATCHER.encode()).decode()
    _ok(f"command -v sudo >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sudo >/dev/null; "
        f"id {SUDO_USER} >/dev/null 2>&1 || useradd -m -s /bin/sh {SUDO_USER}; "
        f"install -d -m 0700 -o {SUDO_USER} -g {SUDO_USER} /home/{SUDO_USER}/.ssh && "
        f"install -m 0600 -o {SUDO_USER} -g {SUDO_USER} /root/.ssh/authorized_keys /home/{SUDO_USER}/.ssh/ && "
        f"echo '{SUDO_USER} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/90-{SUDO_USER} && chmod 0440 /etc/sudoers.d/90-{SUDO_USER}; "
        f"echo {script} | base64 -d > /run/upload-watch.py && chmod 0644 /run/upload-watch.py")
    return SUDO_USER


def _upload_watched(tmp_path, *op_args: str, sudo: tuple[str, ...] = ("--data", "_sudo=true"),
                    inventory: str = INVENTORY) -> tuple[dict, dict]:
    """Run one pyinfra operation as the sudo user while root and nobody watch /tmp; their two reports. ``sudo``:
    how the run asks for sudo (the inventory's `_sudo`, or the command line's `--sudo`)."""
    import json
    import subprocess

    from tests.node.conftest import NODE_SH

    _ok("rm -f /run/watch-stop")
    watchers = {who: subprocess.Popen([NODE_SH, "ssh", NODE, f"{prefix} python3 /run/upload-watch.py"],
                                      stdout=subprocess.PIPE, text=True)
                for who, prefix in (("root", ""), ("nobody", "setpriv --reuid=65534 --regid=65534 --clear-groups"))}
    time.sleep(1)
    try:
        pyinfra(inventory, *op_args, "--limit", NODE, "--data", f"ssh_user={SUDO_USER}", *sudo)
    finally:
        _ok("touch /run/watch-stop")
    reports = {who: json.loads(p.communicate(timeout=30)[0]) for who, p in watchers.items()}
    return reports["root"], reports["nobody"]


def test_a_secret_uploaded_under_sudo_never_sits_in_a_file_others_can_read(sudo_user, tmp_path):
    import secrets as pysecrets

    token = f"sandbox-upload-secret-{pysecrets.token_hex(8)}"
    src = tmp_path / "token"
    src.write_text(token)
    dest = "/etc/inference-nodes/secrets/test-upload-secret"
    uid = int(_ok(f"id -u {sudo_user}"))
    try:
        # control: pyinfra's own sudo upload (files.put) passes through a /tmp file nobody can read
        root, nobody = _upload_watched(tmp_path, "files.put", f"src={src}", "dest=/root/test-upload-control")
        assert any(p.startswith("/tmp/pyinfra-") for p in root["seen"]), root
        assert token in nobody["read"], "control failed: the watcher did not catch pyinfra's world-readable temp file"

        _ok(f"rm -f {dest}")
        root, nobody = _upload_watched(tmp_path, "deploys.ops.secret_file", f"src={src}", f"dest={dest}")
        dirs = {p: v for p, v in root["seen"].items() if v[2]}
        inside = [p for p in root["seen"] if p.startswith(tuple(f"{d}/" for d in dirs))]
        assert dirs and inside, f"the watcher never saw the upload: {root}"
        for path, (mode, owner, _) in dirs.items():
            assert path.startswith("/tmp/inference-nodes-upload-") and mode == "0o700" and owner == uid, (path, mode, owner)
        assert not [p for p in root["seen"] if p.startswith("/tmp/pyinfra-")], root
        assert nobody["read"] == [], "another local user read the secret during the upload"
        assert _ok(f"stat -c '%U %a' {dest}").strip() == "root 600"
        assert _ok(f"cat {dest}") == token
        assert _ok("ls -d /tmp/inference-nodes-upload-* 2>/dev/null | wc -l").strip() == "0"
    finally:
        on_node(NODE, f"rm -f {dest} /root/test-upload-control")


def test_the_sudo_flag_takes_the_same_private_path_as_the_inventorys_sudo(sudo_user, tmp_path):
    """`pyinfra --sudo` sets pyinfra's config, not the host's `_sudo` data: the toolkit's private upload reads the
    effective privilege (deploys/ops.py uses_sudo). Read from the data alone, the upload went straight to the
    destination as the SSH user and failed (permission denied). The flag counts only where no data sets `_sudo`
    (pyinfra's rule: the sandbox's hosts say False, the lab's group data True): a copy of the inventory and its
    group data without either."""
    import secrets as pysecrets
    import shutil

    from tests.node.conftest import INVENTORY as repo_inventory

    group_data = tmp_path / "group_data"
    shutil.copytree("inventories/group_data", group_data)
    lab_all = (group_data / "all.py").read_text()
    assert "\n_sudo = True\n" in lab_all
    (group_data / "all.py").write_text(lab_all.replace("\n_sudo = True\n", "\n"))
    text = open(repo_inventory).read()
    assert '        "_sudo": False,\n' in text
    inventory = tmp_path / "sandbox.py"
    inventory.write_text(text.replace('        "_sudo": False,\n', ""))
    token = f"sandbox-upload-secret-{pysecrets.token_hex(8)}"
    src = tmp_path / "token"
    src.write_text(token)
    dest = "/etc/inference-nodes/secrets/test-upload-secret-flag"
    try:
        root, nobody = _upload_watched(tmp_path, "deploys.ops.secret_file", f"src={src}", f"dest={dest}",
                                       sudo=("--sudo",), inventory=str(inventory))
        assert [p for p in root["seen"] if p.startswith("/tmp/inference-nodes-upload-")], root
        assert nobody["read"] == [], "another local user read the secret during the upload"
        assert _ok(f"stat -c '%U %a' {dest}").strip() == "root 600" and _ok(f"cat {dest}") == token
    finally:
        on_node(NODE, f"rm -f {dest}")


def test_a_secret_taken_out_of_the_inventory_leaves_the_node(converged):
    from deploys.container_runtime import AUTH_FILE
    from deploys.model.snapshot import HUB_TOKEN

    assert on_node(NODE, f"test -f {AUTH_FILE}").returncode == 0, "the sandbox configures registry_auth_file"
    # a hub token left from when the node was in hub mode with a token (the sandbox's nodes push)
    _ok(f"install -d -m 0700 {HUB_TOKEN.rsplit('/', 1)[0]} && echo hf_left_behind > {HUB_TOKEN} && chmod 0600 {HUB_TOKEN}")
    try:
        proc = pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", NODE, "--data", "registry_auth_file=null")
        changed = dict(changed_operations(proc))
        assert changed["Container runtime | Remove registry credentials no longer in the inventory"] == [NODE]
        assert changed["Model snapshot | Remove a hub token no longer in the inventory"] == [NODE]
        assert on_node(NODE, f"test -e {AUTH_FILE} || test -e {HUB_TOKEN}").returncode == 1
        assert "hf_left_behind" not in proc.stdout + proc.stderr
        again = pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", NODE, "--data", "registry_auth_file=null")
        assert [n for n, _ in changed_operations(again) if "Remove" in n] == []
    finally:  # the sandbox's own configuration back: the credentials return
        back = dict(changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", NODE)))
    assert back["Container runtime | Install registry credentials (0600, never printed)"] == [NODE]
    assert _ok(f"stat -c '%U %a' {AUTH_FILE}").strip() == "root 600"


# --- the push fan-out's seed daemon -------------------------------------------------------------------
def test_a_killed_fanout_run_leaves_no_password_and_its_seed_admits_only_its_targets(sandbox):
    """Killed while sandbox-b1 pulls from sandbox-a's seed: b1's password goes when its pull ends, the seed
    takes its secret directory along when it stops, and meanwhile it answers its targets' address only."""
    import os
    import signal
    import socket
    import subprocess

    from deploys.model.fanout import PULL_UNIT, SEED_DIR, SEED_UNIT
    from tests.node.conftest import PYINFRA
    from tests.node.test_80_model_fanout import MODEL_ONLY, ROOT, group_args

    def greeting(source: str) -> bytes:
        with socket.socket() as s:
            s.settimeout(3)
            s.bind((source, 0))
            try:
                s.connect(("127.0.0.1", 8731))
                return s.recv(64)
            except OSError as e:
                return repr(e).encode()

    for node in sandbox:
        assert on_node(node, f"rm -rf {ROOT}").returncode == 0
    proc = subprocess.Popen([PYINFRA, "-y", INVENTORY, MODEL_ONLY, *group_args("plain")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        seen = on_node("sandbox-b1", f"for i in $(seq 1200); do ls {SEED_DIR}/password-* 2>/dev/null && exit 0; "
                                     "sleep 0.05; done; exit 1")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert seen.returncode == 0, "sandbox-b1 never pulled from a peer"
        # the killed run left sandbox-a's seed serving: it admits sandbox-b1's address (127.0.0.1) only
        assert on_node("sandbox-a", f"systemctl is-active --quiet {SEED_UNIT}").returncode == 0
        shown = on_node("sandbox-a", f"systemctl show -p IPAddressAllow -p IPAddressDeny -p RuntimeMaxUSec {SEED_UNIT}").stdout
        assert "IPAddressAllow=127.0.0.1/32" in shown and "0.0.0.0/0" in shown and "RuntimeMaxUSec=6h" in shown, shown
        assert greeting("127.0.0.1").startswith(b"@RSYNCD:")
        assert not greeting("127.0.0.2").startswith(b"@RSYNCD:")
        # sandbox-b1's pull unit ends on its own (the run that started it is gone) and takes the password along
        assert on_node("sandbox-b1", f"for i in $(seq 600); do systemctl is-active --quiet '{PULL_UNIT}-*.service' "
                                     "|| exit 0; sleep 0.1; done; exit 1").returncode == 0
        guard = on_node("sandbox-b1", f"systemctl list-timers --no-legend '{PULL_UNIT}-*-guard.timer'").stdout.strip()
        if guard:  # killed between writing the password and starting the pull: the guard removes it, here now
            assert on_node("sandbox-b1", f"systemctl start '{guard.split()[-2].replace('.timer', '.service')}'").returncode == 0
        assert on_node("sandbox-b1", f"ls {SEED_DIR}/password-* 2>/dev/null | wc -l").stdout.strip() == "0"
        # the seed stops (as RuntimeMaxSec would stop it) and its secret directory goes with it
        assert on_node("sandbox-a", f"test -f {SEED_DIR}/secrets && systemctl stop {SEED_UNIT} && "
                                    f"test ! -e {SEED_DIR}").returncode == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for node in sandbox:
            on_node(node, f"systemctl stop {SEED_UNIT} 2>/dev/null; rm -rf {ROOT}")
        pyinfra(INVENTORY, "deploys/all.py")  # each node's own model, manifest and gate again


# --- the control host stays clean ----------------------------------------------------------------------
def test_this_machine_serves_no_registry_beyond_loopback(sandbox):
    """While nodes are up the harness's registry listens on 127.0.0.1:5000 only; Debian's docker-registry
    package's own service (all interfaces) is masked, disabled and not running."""
    import glob
    import os
    import pwd

    from tests.unit.test_sandbox_harness import listeners_on

    with open("/proc/net/tcp") as f:
        tcp = f.read()
    with open("/proc/net/tcp6") as f:
        assert not [line for line in f.read().splitlines()[1:] if line.split()[3] == "0A"
                    and int(line.split()[1].split(":")[1], 16) == 5000], "a registry listens on IPv6"
    assert listeners_on(5000, tcp) == ["127.0.0.1"]
    if os.path.exists("/lib/systemd/system/docker-registry.service"):
        assert os.readlink("/etc/systemd/system/docker-registry.service") == "/dev/null"
        assert not os.path.lexists("/etc/systemd/system/multi-user.target.wants/docker-registry.service")
    assert not glob.glob("/etc/rc[2-5].d/S*docker-registry")
    try:
        uid = pwd.getpwnam("docker-registry").pw_uid
    except KeyError:
        return
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as f:
                real_uid = next(line for line in f if line.startswith("Uid:")).split()[1]
        except (OSError, StopIteration):
            continue
        assert int(real_uid) != uid, f"the package's registry daemon runs: {status}"


def test_an_nvidia_line_beside_the_distributions_is_disabled_alone_in_both_formats(converged):
    """A host whose `/etc/apt/sources.list` holds a hand-added CUDA line beside the distribution's, and whose deb822
    `ubuntu.sources`-style file holds an NVIDIA stanza beside the distribution's: the converge disables those two
    entries only (a `#`, `Enabled: no`), real apt still reads the distribution's entries, and the next converge
    changes nothing."""
    cuda = ("deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "  # the toolkit's repo: every
            "http://127.0.0.1:8801/libnvidia-container/stable/deb/$(ARCH) /")              # profile's own source names it
    distro = "deb http://deb.debian.org/debian trixie main"
    stanzas = ("Types: deb\nURIs: http://deb.debian.org/debian/\nSuites: trixie-updates\nComponents: main\n\n"
               "Types: deb\nURIs: http://127.0.0.1:8801/libnvidia-container/stable/deb/$(ARCH)/\nSuites: /\n"
               "Signed-By: /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg\n")
    _ok("cp -a /etc/apt/sources.list /run/sources.list.before 2>/dev/null || touch /run/sources.list.before; "
        f"printf '%s\\n%s\\n' '{distro}' '{cuda}' >> /etc/apt/sources.list; "
        f"printf '%s' '{stanzas}' > /etc/apt/sources.list.d/distro.sources")
    try:
        proc = pyinfra(INVENTORY, "deploys/all.py", "--limit", NODE)
        assert "disabling apt entries for the repos" in proc.stderr, proc.stderr[-3000:]
        listing = _ok("cat /etc/apt/sources.list")
        assert distro in listing.splitlines() and f"# inference-nodes: disabled" in listing
        assert cuda not in listing.splitlines(), "the CUDA line is still enabled"
        deb822 = _ok("cat /etc/apt/sources.list.d/distro.sources")
        assert deb822.count("Enabled: no") == 1 and deb822.index("Enabled: no") > deb822.index("libnvidia-container")
        targets = _ok("apt-get indextargets --format '$(URI)' 2>&1; apt-get update --print-uris 2>&1")
        assert "Conflicting values" not in targets and "deb.debian.org/debian/dists/trixie-updates" in targets
        assert changed_operations(pyinfra("--json", INVENTORY, "deploys/all.py", "--limit", NODE)) == []
    finally:
        _ok("cp -a /run/sources.list.before /etc/apt/sources.list; rm -f /etc/apt/sources.list.d/distro.sources "
            "/etc/apt/sources.list.inference-nodes-orig /etc/apt/sources.list.d/distro.sources.inference-nodes-orig")
