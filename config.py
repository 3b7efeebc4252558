# pyinfra reads this file from the working directory (run everything from the repo root).
# Attributes must be assigned on `config`: bare names here are ignored by pyinfra.
from pyinfra import config

config.REQUIRE_PYINFRA_VERSION = "==3.10.0"

# Validate the inventory before pyinfra connects to any host (deploys/validate.py): a bad value is
# reported even when every host is unreachable.
from pyinfra.context import ctx_state  # noqa: E402

from deploys.validate import validate_before_connect  # noqa: E402

validate_before_connect(ctx_state.get())
