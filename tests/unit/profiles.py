"""The reference profiles' group data as plain dicts, for tests that build a node config from one."""

import runpy


def profile(group: str) -> dict:
    data = runpy.run_path(f"inventories/group_data/{group}.py")
    return {k: v for k, v in data.items() if not k.startswith("__")}
