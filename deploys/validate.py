"""Validate the whole inventory against the schema before any host is touched, and before any connection.

Three entries give the same verdict (deploys/schema ``validate_inventory``):

- ``python -m deploys.validate INVENTORY [--limit …]``: no connection, no network; exit 1 with the problem list.
- ``config.py`` calls :func:`check_cli_run` inside pyinfra's CLI, before the inventory is loaded and before any
  connection: a bad value or a limit that selects nothing stops the run there (exit 1), so unreachable hosts
  cannot hide it behind "Could not connect".
- the ``validate`` deploy (first in deploys/all.py), for runs through pyinfra's API without config.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from fnmatch import fnmatch

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.api.exceptions import NoGroupError

from deploys.inventory import LimitError, inventory_configs, is_inference_node, limited_hosts, load_inventory
from deploys.schema import InventoryValidationError, NodeConfig, validate_inventory
from deploys.schema.cross_host import monitoring_only_validated, monitoring_warnings


@deploy("Validate inventory")
def validate():
    """Raise InventoryValidationError (the run stops before executing anything) on any bad key.

    Runs while pyinfra prepares operations, so a bad value on any host stops every host.
    """
    configs = inventory_configs(host.inventory)
    if not is_inference_node(host):
        logger.info(f"{host.print_prefix}inventory valid: monitoring host only (no serving cluster)")
        return
    cfg = configs[host.name]
    logger.info(f"{host.print_prefix}inventory valid: cluster {cfg.cluster_name}, rank {cfg.node_rank}")


def is_node_inventory(inventory) -> bool:
    """An inventory of inference nodes (some host carries a schema key), not an ad-hoc `pyinfra @local exec`."""
    return any(key in NodeConfig.model_fields for h in inventory for key in h.data.dict())


# pyinfra commands that run no toolkit code: an inventory problem is shown, and they run anyway (an incident's
# `pyinfra inventories/lab.py exec -- uptime` must not wait for a profile's gaps to be filled)
AD_HOC_COMMANDS = ("exec", "fact", "debug-inventory")


def check_cli_run() -> None:
    """From config.py, inside pyinfra's CLI before it loads the inventory or connects: load the inventory file the
    command names (with its ``--data`` and ``--group-data``), resolve ``--limit``/``--exclude`` as every entry point
    does (deploys/inventory.py hosts_matching) and validate it. A limit that selects nothing or something else than
    pyinfra would, or an invalid inventory for a deploy, ends the run with the problems (exit 1) before any host
    is touched; for an ad-hoc command the inventory's problems are a warning."""
    import click
    from pyinfra_cli.util import parse_cli_arg

    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx is not None else {}
    inventory_file, operations = params.get("inventory"), params.get("operations") or ()
    if not inventory_file or not os.path.isfile(inventory_file) or not operations:
        return  # `@local`, `host1,host2`, a module: pyinfra's own ways, nothing of this toolkit's to check
    override = {key: parse_cli_arg(value) for key, value in (d.split("=", 1) for d in params.get("data") or ())}
    for key in ("ssh_user", "ssh_key", "ssh_port"):
        if params.get(key):
            override[key] = params[key]
    inventory = load_inventory(inventory_file, override, tuple(params.get("group_data") or ()))
    try:
        limit = limited_hosts(inventory, params.get("limit") or (), params.get("exclude") or ())
        for option in ("limit", "exclude"):
            for pattern in params.get(option) or ():
                _pyinfra_selects_the_same(inventory, pattern, f"--{option}", inventory_file)
    except LimitError as e:
        logger.error(f"--> {e}")
        raise SystemExit(1) from None
    if not is_node_inventory(inventory):
        return
    try:
        configs = validate_inventory(inventory, limit)
    except InventoryValidationError as e:
        if operations[0] in AD_HOC_COMMANDS:
            logger.warning(f"--> {e}\n    ({operations[0]} runs anyway: it runs none of the toolkit's steps; "
                           "a deploy would stop here)")
            return
        logger.error(f"--> {e}")
        raise SystemExit(1) from None
    for warning in monitoring_warnings(inventory, configs):
        logger.warning(f"--> {warning}")


def _pyinfra_selects_the_same(inventory, pattern: str, option: str, inventory_file: str) -> None:
    """pyinfra resolves the CLI's limit itself (a group, else a glob): a cluster name it does not know as a group
    would select nothing there."""
    try:
        inventory.get_group(pattern)
        return
    except NoGroupError:
        pass
    if any(fnmatch(h.name, pattern) for h in inventory):
        return
    raise LimitError(f"{option} {pattern}: cluster {pattern} is not a pyinfra group of {inventory_file}, so pyinfra "
                     "would select nothing; end the inventory with `with_cluster_groups(globals())` "
                     "(deploys/inventory.py), as inventories/lab.py does")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploys.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument("inventory")
    parser.add_argument("--limit", action="append", default=[], help="a host, group or cluster (glob; repeatable)")
    parser.add_argument("--exclude", action="append", default=[], help="as --limit, left out")
    args = parser.parse_args(argv)
    inventory = load_inventory(args.inventory)
    try:
        limit = limited_hosts(inventory, args.limit, args.exclude)
        configs = validate_inventory(inventory, limit)
    except (LimitError, InventoryValidationError) as e:
        print(e, file=sys.stderr)
        return 1
    for warning in monitoring_warnings(inventory, configs):
        print(f"warning: {warning}", file=sys.stderr)
    only = monitoring_only_validated(inventory)[0]
    for h in inventory:
        if limit is not None and h not in limit:
            continue
        if h.name in only:
            print(f"{h.name}: valid (monitoring host only: no serving cluster)")
        elif h.name in configs:
            print(f"{h.name}: valid (cluster {configs[h.name].cluster_name}, rank {configs[h.name].node_rank})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
