"""Validate the whole inventory against the schema before any host is touched, and before any connection.

Three entries give the same verdict (deploys/schema ``validate_inventory``):

- ``python -m deploys.validate INVENTORY``: no connection, no network; exit 1 with the problem list.
- ``config.py`` registers :class:`ValidateBeforeConnect` (:func:`validate_before_connect`), a pyinfra state
  callback whose ``host_before_connect`` runs before pyinfra opens the first connection: a bad value stops
  the run there, so unreachable hosts cannot hide it behind "Could not connect".
- the ``validate`` deploy (first in deploys/all.py), for runs through pyinfra's API without config.py.
"""

from __future__ import annotations

import sys

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import ConnectError
from pyinfra.api.state import BaseStateCallback

from deploys.inventory import inventory_configs
from deploys.schema import InventoryValidationError, NodeConfig, validate_inventory


@deploy("Validate inventory")
def validate():
    """Raise InventoryValidationError (the run stops before executing anything) on any bad key.

    Runs while pyinfra prepares operations, so a bad value on any host stops every host.
    """
    configs = inventory_configs(host.inventory)
    cfg = configs[host.name]
    logger.info(f"{host.print_prefix}inventory valid: cluster {cfg.cluster_name}, rank {cfg.node_rank}")


def is_node_inventory(inventory) -> bool:
    """An inventory of inference nodes (some host carries a schema key), not an ad-hoc `pyinfra @local exec`."""
    return any(key in NodeConfig.model_fields for h in inventory for key in h.data.dict())


def _not_connected(*args, **kwargs):
    raise ConnectError("not connected: the inventory is invalid (see above)")


class ValidateBeforeConnect(BaseStateCallback):
    """Validates the inventory once, at the first host's ``host_before_connect``. On a bad value it prints
    the problems and swaps every host's connector ``connect`` for one that raises ConnectError: pyinfra
    then reports each host as not connected and stops ("No hosts remaining!", exit 1) without opening a
    single connection."""

    def __init__(self):
        self.checked: set[int] = set()

    def host_before_connect(self, state, host):
        if id(state.inventory) in self.checked:
            return
        self.checked.add(id(state.inventory))
        if not is_node_inventory(state.inventory):
            return
        try:
            inventory_configs(state.inventory)
        except InventoryValidationError as e:
            logger.error(f"--> {e}")
            for each in state.inventory:
                each.connector.connect = _not_connected


def validate_before_connect(state) -> None:
    """Register :class:`ValidateBeforeConnect` on ``state`` once pyinfra initialises it (``State.init``
    resets the callback list, and config.py runs before it): called from config.py."""
    init = state.init

    def init_then_register(*args, **kwargs):
        init(*args, **kwargs)
        state.add_callback_handler(ValidateBeforeConnect())

    state.init = init_then_register


def main(argv: list[str]) -> int:
    from deploys.inventory import load_inventory

    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m deploys.validate INVENTORY", file=sys.stderr)
        return 2
    try:
        configs = validate_inventory(load_inventory(argv[0]))
    except InventoryValidationError as e:
        print(e, file=sys.stderr)
        return 1
    for name, cfg in configs.items():
        print(f"{name}: valid (cluster {cfg.cluster_name}, rank {cfg.node_rank})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
