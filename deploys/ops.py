"""Operations shared by several components: per-host failure, verified apt keyrings, apt holds."""

from __future__ import annotations

import hashlib

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.facts.files import Sha256File
from pyinfra.facts.server import Command

from facts.apt import AptHolds, KeyringFingerprints


def _log_and_fail(state, host, message: str) -> bool:
    host.log_styled(message, fg="red", log_func=logger.error)
    return False


def fail_host(message: str) -> FunctionCommand:
    """A command that fails this host alone, with ``message`` (raising in an operation aborts every host)."""
    return FunctionCommand(_log_and_fail, (message,), {})


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
        local = hashlib.sha256(f.read()).hexdigest()
    remote = host.get_fact(Sha256File, path=dest)
    mode = host.get_fact(Command, command=f"stat -c '%U %a' {dest} 2>/dev/null || true")
    if remote == local and mode == "root 600":
        host.noop(f"{dest} up to date (0600)")
        return
    yield StringCommand("install", "-d", "-m", "0700", "-o", "root", "-g", "root", QuoteString(dest.rsplit("/", 1)[0]))
    yield StringCommand("touch", QuoteString(dest), "&&", "chmod", "0600", QuoteString(dest))
    yield FileUploadCommand(src, dest)
    yield StringCommand("chown", "root:root", QuoteString(dest), "&&", "chmod", "0600", QuoteString(dest))
