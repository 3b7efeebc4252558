"""The sandbox nodes an inventory names, as `name port` lines (for node.sh, the Makefile and the tests)."""

from __future__ import annotations

import sys

from deploys.inventory import load_inventory


def sandbox_nodes(inventory_file: str = "inventories/sandbox.py") -> list[tuple[str, int]]:
    return [(h.name, int(h.data.ssh_port)) for h in load_inventory(inventory_file)]


if __name__ == "__main__":
    for name, port in sandbox_nodes(*sys.argv[1:]):
        print(name, port)
