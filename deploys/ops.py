"""Operations shared by several components: per-host failure, verified apt keyrings, apt holds."""

from __future__ import annotations

import hashlib
import io
import posixpath

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation

from facts.apt import AptHolds, KeyringFingerprints
from facts.host import ManagedFiles


def flat_repo_source(header: str, uri: str, keyring: str) -> str:
    """A deb822 source for a flat apt repo (`Suites: /`, the layout NVIDIA's CUDA and toolkit repos use)."""
    return f"{header}Types: deb\nURIs: {uri.rstrip('/')}/\nSuites: /\nSigned-By: {keyring}\n"


def _log_and_fail(state, host, message: str) -> bool:
    host.log_styled(message, fg="red", log_func=logger.error)
    return False


def fail_host(message: str) -> FunctionCommand:
    """A command that fails this host alone, with ``message`` (raising in an operation aborts every host)."""
    return FunctionCommand(_log_and_fail, (message,), {})


@operation()
def atomic_put(src, dest: str, user: str = "root", group: str = "root", mode: str = "0644",
               create_remote_dir: bool = True, batch: tuple[str, ...] = ()):
    """Like files.put, but a killed run never leaves a half-written file in place: the content is
    uploaded next to ``dest`` and renamed over it (pyinfra writes in place when it does not sudo).

    + src: a local path, or the content as a file-like object
    + dest: remote path
    + user, group, mode: ownership and permissions (mode as a string)
    + create_remote_dir: create the parent directory first (as files.put does)
    + batch: every file the calling deploy manages (``dest`` among them): their state is read in one
      round trip, once per run (deploys/fact_cache.py)
    """
    if hasattr(src, "read"):
        data = src.read()
        src.seek(0)  # the operation body runs again at execute time
        data = data.encode() if isinstance(data, str) else data
    else:
        with open(src, "rb") as f:
            data = f.read()
    paths = tuple(batch) if dest in batch else (dest,)
    remote = host.get_fact(ManagedFiles, paths=paths).get(dest)
    if remote and (remote["sha1"], remote["user"], remote["group"], remote["mode"]) == (
        hashlib.sha1(data).hexdigest(), user, group, int(mode)
    ):
        host.noop(f"{dest} is up to date")
        return
    tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.inference-nodes-tmp")
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
def keyring_verified(url: str, fingerprint: str, dest: str):
    """Fetch an apt signing key on the node, refuse it unless it has ``fingerprint``, store it dearmored.

    + url: where the key is published (https:// or file://)
    + fingerprint: the full 40-hex fingerprint it must carry
    + dest: keyring path for ``Signed-By:``
    """
    if fingerprint in host.get_fact(KeyringFingerprints, path=dest):
        host.noop(f"{dest} holds key {fingerprint}")
        return
    script = (
        'set -e; t=$(mktemp); trap \'rm -f "$t" "$t.gpg"\' EXIT; curl -fsSL "$1" -o "$t"; '
        'if ! gpg --show-keys --with-colons "$t" 2>/dev/null | grep -q "^fpr:*$2:"; then '
        'echo "key at $1 does not have fingerprint $2: refused" >&2; exit 1; fi; '
        'if grep -q "BEGIN PGP PUBLIC KEY" "$t"; then gpg --dearmor < "$t" > "$t.gpg"; else cp "$t" "$t.gpg"; fi; '
        'install -D -m 0644 "$t.gpg" "$3"'
    )
    yield StringCommand("sh", "-c", QuoteString(script), "keyring", QuoteString(url), QuoteString(fingerprint),
                        QuoteString(dest))


@operation()
def apt_held(packages: list[str]):
    """`apt-mark hold` each of ``packages`` that is not held yet.

    + packages: installed package names
    """
    held = set(host.get_fact(AptHolds))
    missing = [p for p in packages if p not in held]
    if not missing:
        host.noop(f"{len(packages)} package(s) held")
        return
    yield StringCommand("apt-mark", "hold", *missing)


@operation()
def secret_file(src: str, dest: str):
    """Copy a secret from the control node, mode 0600 root, without ever printing its content
    (files.put would show it under --diff).

    + src: control-node path
    + dest: node path
    """
    with open(src, "rb") as f:
        local = hashlib.sha1(f.read()).hexdigest()
    remote = host.get_fact(ManagedFiles, paths=(dest,)).get(dest)  # content hash, owner and mode: one round trip
    if remote and (remote["sha1"], remote["user"], remote["mode"]) == (local, "root", 600):
        host.noop(f"{dest} up to date (0600)")
        return
    yield StringCommand("install", "-d", "-m", "0700", "-o", "root", "-g", "root", QuoteString(dest.rsplit("/", 1)[0]))
    yield StringCommand("touch", QuoteString(dest), "&&", "chmod", "0600", QuoteString(dest))
    yield FileUploadCommand(src, dest)
    yield StringCommand("chown", "root:root", QuoteString(dest), "&&", "chmod", "0600", QuoteString(dest))
