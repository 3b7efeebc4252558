"""Validate the whole inventory against the schema before any host is touched."""

from pyinfra import host, logger
from pyinfra.api import deploy

from deploys.inventory import inventory_configs

DEFAULTS: dict = {}  # reads every schema key (deploys/schema.py) and sets none itself


@deploy("Validate inventory")
def validate():
    """Raise InventoryValidationError (the run stops before executing anything) on any bad key.

    Runs while pyinfra prepares operations, so a bad value on any host stops every host.
    """
    configs = inventory_configs(host.inventory)
    cfg = configs[host.name]
    logger.info(f"{host.print_prefix}inventory valid: cluster {cfg.cluster_name}, rank {cfg.node_rank}")
