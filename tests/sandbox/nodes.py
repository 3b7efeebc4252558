"""The sandbox nodes an inventory names, as `name port gpus` lines (for node.sh, the Makefile and the tests)."""

from __future__ import annotations

import sys

from deploys.inventory import inventory_configs, load_inventory


def sandbox_nodes(inventory_file: str = "inventories/sandbox.py") -> list[tuple[str, int, int]]:
    """(name, ssh port, stand-in GPU count = the node's gpu_indices) for every host."""
    inventory = load_inventory(inventory_file)
    configs = inventory_configs(inventory)
    return [(h.name, int(h.data.ssh_port), max(configs[h.name].gpu_indices) + 1) for h in inventory]


if __name__ == "__main__":
    for name, port, gpus in sandbox_nodes(*sys.argv[1:]):
        print(name, port, gpus)
