# pyinfra reads this file from the working directory (run everything from the repo root).
# Attributes must be assigned on `config`: bare names here are ignored by pyinfra.
from pyinfra import config

config.REQUIRE_PYINFRA_VERSION = "~=3.10.0"  # patch releases; the same range as pyproject.toml

# Before pyinfra loads the inventory or connects to any host (deploys/validate.py): `--limit` resolved as every
# entry point resolves it (a limit that selects nothing is an error), and the inventory validated: a bad value is
# reported even when every host is unreachable; ad-hoc `exec`/`fact` only warn.
from deploys.validate import check_cli_run  # noqa: E402

check_cli_run()
