"""The reference profiles' group data as plain dicts, for tests that build a node config from one."""

import runpy
import types


def profile(group: str) -> dict:
    """As pyinfra reads a group data file: its names, less dunders and imported modules."""
    data = runpy.run_path(f"inventories/group_data/{group}.py")
    return {k: v for k, v in data.items() if not k.startswith("__") and not isinstance(v, types.ModuleType)}


# What an admin who verified deployment C would set for its profile gaps (test values: a commit, a tag and a
# digest that stand for "verified"; the lab file itself leaves them open, and deploys of C are refused).
C_FILLED_IN = {
    "model_revision": "9e165c30e2704aec5d9d593cce3eebd58bbef1cb",
    "image": "docker.io/aidendle94/sparkrun-vllm-ds4-gb10:verified-by-test",
    "image_digest": "sha256:" + "c" * 64,
}


def lab_filled_in(dest) -> str:
    """A copy of inventories/ under ``dest`` whose profile C has its gaps set; returns the lab inventory path."""
    import os
    import shutil

    inv = os.path.join(str(dest), "inventories")
    shutil.copytree("inventories", inv, dirs_exist_ok=True)
    with open(os.path.join(inv, "group_data", "gb10_mtp.py"), "a") as f:
        f.write("\n# filled in by tests/unit/profiles.py (an admin's verified values)\n")
        for key, value in C_FILLED_IN.items():
            f.write(f"{key} = {value!r}\n")
    return os.path.join(inv, "lab.py")
