"""The README's key table is the schema's, and documents every key the reference inventories use."""

from pathlib import Path

from deploys.inventory import load_inventory
from deploys.schema import NodeConfig, readme_with_table, schema_data

README = Path("README.md").read_text()


def test_readme_key_table_matches_the_schema():
    assert readme_with_table(README) == README, "run `make readme-keys` and commit README.md"


def test_every_schema_key_is_in_the_readme_and_every_inventory_key_is_in_the_schema():
    for key in NodeConfig.model_fields:
        assert f"| `{key}` (" in README
    for inventory in ("inventories/lab.py", "inventories/sandbox.py"):
        for host in load_inventory(inventory):
            assert set(schema_data(host.data.dict())) <= set(NodeConfig.model_fields)


def test_readme_test_command_is_what_ci_runs():
    assert "make test" in README
    assert "make test" in Path(".ci/run").read_text()
