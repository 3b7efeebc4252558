"""The key table of docs/inventory-keys.md is the schema's, and documents every key the reference inventories use;
the README, the front door, names the test command CI runs and links every page of docs/."""

import re
from pathlib import Path

from deploys.inventory import load_inventory
from deploys.schema import KEYS_PAGE, NodeConfig, readme_with_table, schema_data

README = Path("README.md").read_text()
KEYS = Path(KEYS_PAGE).read_text()


def test_key_table_matches_the_schema():
    assert readme_with_table(KEYS) == KEYS, f"run `make readme-keys` and commit {KEYS_PAGE}"


def test_every_schema_key_is_in_the_key_table_and_every_inventory_key_is_in_the_schema():
    for key in NodeConfig.model_fields:
        assert f"| `{key}` (" in KEYS
    for inventory in ("inventories/lab.py", "inventories/sandbox.py"):
        for host in load_inventory(inventory):
            assert set(schema_data(host.data.dict())) <= set(NodeConfig.model_fields)


def test_readme_test_command_is_what_ci_runs():
    assert "make test" in README
    assert "make test" in Path(".ci/run").read_text()


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_links_every_docs_page_and_every_relative_link_resolves():
    pages = sorted(p.as_posix() for p in Path("docs").glob("*.md"))
    for page in pages:
        assert f"]({page})" in README, f"README.md's Documentation list lacks {page}"
    for doc in [Path("README.md"), *map(Path, pages)]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if "://" in target:
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            assert path.exists(), f"{doc}: link to {target}"
            if anchor:
                assert anchor in _anchors(path.read_text()), f"{doc}: link to {target}: no such heading"
