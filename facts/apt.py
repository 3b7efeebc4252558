"""apt facts pyinfra does not ship: holds, and the primary-key fingerprints of a keyring file."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from files import helper_text


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


class AptSourcesNaming(FactBase[dict]):
    """The enabled apt entries, in files other than ``own``, that name any of ``uris`` (as a prefix: `…/amd64` matches
    `…/amd64/`), in the order apt reads them: ``{"entries": ["<file>:<line>", ...], "mixed": [...]}`` (``mixed``:
    deb822 stanzas whose URIs name an NVIDIA repo and others: files/apt/nvidia_sources.py). A commented line or a
    stanza with `Enabled: no` does not count."""

    def command(self, uris: tuple[str, ...], own: tuple[str, ...], etc: str = "/etc/apt") -> str:
        return nvidia_sources_command("find", uris, own, etc)

    def process(self, output: list[str]) -> dict:
        try:
            report = json.loads(output[-1])
        except (IndexError, ValueError) as e:
            raise FactProcessError(f"AptSourcesNaming: unexpected output {output[-3:]!r}") from e
        return {"entries": list(report.get("entries", [])), "mixed": list(report.get("mixed", []))}


def nvidia_sources_command(mode: str, uris: tuple[str, ...], own: tuple[str, ...], etc: str = "/etc/apt") -> str:
    """files/apt/nvidia_sources.py run on the node with `python3 -c` (``mode``: find or disable)."""
    args = " ".join(shlex.quote(a) for a in (mode, etc, ",".join(own), *uris))
    return f"python3 -c {shlex.quote(helper_text('apt/nvidia_sources.py'))} {args}"
