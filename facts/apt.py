"""apt facts pyinfra does not ship: holds, and the key fingerprints of a keyring file."""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase


class AptHolds(FactBase[list]):
    """Packages on hold (`apt-mark showhold`)."""

    default = list

    def requires_command(self) -> str:
        return "apt-mark"

    def command(self) -> str:
        return "apt-mark showhold"

    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip().split(":")[0] for line in output if line.strip())


class KeyringFingerprints(FactBase[list]):
    """Fingerprints of the keys in an OpenPGP keyring file ([] when absent or unreadable)."""

    default = list

    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return (
            f"if [ -f {q} ] && command -v gpg >/dev/null; then "
            f"gpg --show-keys --with-colons {q} 2>/dev/null | awk -F: '$1==\"fpr\" {{print $10}}'; fi"
        )

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if re.fullmatch(r"[0-9A-F]{40}", line.strip())]
