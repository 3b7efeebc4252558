"""apt facts pyinfra does not ship: holds, and the primary-key fingerprints of a keyring file."""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase


def held_packages(showhold: list[str]) -> list[str]:
    """Package names from `apt-mark showhold` lines, architecture qualifiers dropped (`libfoo:amd64`), sorted:
    the one parser of holds (AptHolds, and the holds section of facts/nvidia.py NvidiaDriverPackages)."""
    return sorted(line.strip().split(":")[0] for line in showhold if line.strip())


class AptHolds(FactBase[list]):
    """Packages on hold (`apt-mark showhold`)."""

    default = list

    def requires_command(self) -> str:
        return "apt-mark"

    def command(self) -> str:
        return "apt-mark showhold"

    def process(self, output: list[str]) -> list[str]:
        return held_packages(output)


class KeyringFingerprints(FactBase[list]):
    """Fingerprints of the primary keys in an OpenPGP keyring file, subkeys left out ([] when absent or
    unreadable): a keyring the deploy wrote holds exactly one."""

    default = list

    def command(self, path: str) -> str:
        q = shlex.quote(path)
        return f"if [ -f {q} ] && command -v gpg >/dev/null; then gpg --show-keys --with-colons {q} 2>/dev/null; fi"

    def process(self, output: list[str]) -> list[str]:
        primaries, after_primary = [], False  # the fpr line right after a pub/sec line is the primary's
        for line in output:
            fields = line.strip().split(":")
            if fields[0] in ("pub", "sec"):
                after_primary = True
            elif fields[0] == "fpr" and after_primary:  # any primary counts, whatever its fingerprint's form
                after_primary = False
                primaries.append(fields[9] if len(fields) > 9 else "")
        return primaries


class AptSourcesNaming(FactBase[list]):
    """apt source files (`/etc/apt/sources.list`, `sources.list.d/*.list`, `*.sources`) other than ``own`` with an
    uncommented line naming any of ``uris`` (as a prefix: `…/amd64` matches `…/amd64/`), in the order apt reads them."""

    default = list

    def command(self, uris: tuple[str, ...], own: tuple[str, ...], etc: str = "/etc/apt") -> str:
        patterns = " ".join(f"-e {shlex.quote(u)}" for u in uris)
        skip = "|".join(shlex.quote(p) for p in own) or "''"
        e = shlex.quote(etc)
        return (f"for f in {e}/sources.list {e}/sources.list.d/*.list {e}/sources.list.d/*.sources; do "
                f'[ -f "$f" ] || continue; case "$f" in {skip}) continue;; esac; '
                f'sed "s/#.*//" "$f" | grep -qF {patterns} && echo "$f"; done; true')

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
