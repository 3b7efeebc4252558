"""dpkg's own view of itself: packages an interrupted run left unpacked or half-configured."""

from __future__ import annotations

from pyinfra.api import FactBase


class DpkgAudit(FactBase[list]):
    """`dpkg --audit`: one line per problem it reports ([] when the package database is consistent).

    A package unpacked but never configured (a killed `apt-get install`, a dpkg run cut by a reboot)
    shows here; apt refuses to install anything until `dpkg --configure -a` has run.
    """

    default = list

    def requires_command(self) -> str:
        return "dpkg"

    def command(self) -> str:
        return "dpkg --audit 2>&1 || true"  # reads the status file only: no lock, works while apt runs

    def process(self, output: list[str]) -> list[str]:
        return [line.rstrip() for line in output if line.strip()]
