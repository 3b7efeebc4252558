# pyinfra reads this file from the working directory (run everything from the repo root).
# Attributes must be assigned on `config`: bare names here are ignored by pyinfra.
from pyinfra import config

config.REQUIRE_PYINFRA_VERSION = "==3.10.0"
