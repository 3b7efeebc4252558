"""Building blocks every component's keys use: the key declaration, typed paths and env maps, the
patterns, the secret-name rule.

Characters and names that reach a unit file are defined where they are written (deploys/unit_text.py)
and the safe path characters where the node reads them (files/model_snapshot/snapshot_manifest.py, which
runs on nodes alone); this module only applies them to inventory values.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import PurePosixPath
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from deploys.unit_text import ENV_NAME
from files.model_snapshot.snapshot_manifest import SAFE_PATH

HEX40 = re.compile(r"[0-9a-f]{40}")  # patterns are used with fullmatch: `$` would accept a trailing newline
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

# Directories a writable mount or directory must never be (or cover).
SYSTEM_DIRS = frozenset({"/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/var", "/run", "/boot", "/root"})

# Variable names that carry secrets belong in the secret-file keys, never in a unit or env file.
# Matched on the name's `_`-separated words: HF_TOKEN and DB_PASSWORD are secrets, MAX_NUM_BATCHED_TOKENS is not.
SECRET_NAME = re.compile(
    r"(?i)(.*[_-])?(TOKEN|PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIALS?|APIKEY|AUTH|COOKIE"
    r"|(API|PRIVATE|ACCESS|SECRET)[_-]KEY)([_-].*)?"
)
# Keys whose value is a control-node path to a secret: a value that is not a path may be the secret itself.
SECRET_FILE_KEYS = ("model_hub_token_file", "registry_auth_file")


class ComponentKeys(BaseModel):
    """The base of every component's keys: unknown keys are errors, values frozen, no inf/nan."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)


def _key(default: Any = ..., description: str = "", **kw: Any) -> Any:
    """A schema key: its default and the one-line meaning shown in the README table."""
    if not description:
        raise TypeError("every key needs a description")
    return Field(default, description=description, **kw)


def is_safe_path(value: str) -> bool:
    """An absolute path of only the characters every consumer of a path handles without quoting surprises:
    Volume= (`:` separates), ExecStartPre= and shells (spaces, quotes, `%`, `$`), rsync (`:` means a remote),
    globbing."""
    return value.startswith("/") and bool(SAFE_PATH.fullmatch(value))


def _absolute(value: str) -> str:
    if not PurePosixPath(value).is_absolute() or ".." in PurePosixPath(value).parts:
        raise ValueError("an absolute path without '..'")
    if not is_safe_path(value):
        raise ValueError("a path of letters, digits and . _ - + @ = , only (no spaces, ':', quotes, '%', '$', "
                         "control characters or non-ASCII: unit files, Volume= and rsync must read it back unchanged)")
    return str(PurePosixPath(value))


AbsPath = Annotated[str, AfterValidator(_absolute)]


def _env_map(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if not ENV_NAME.fullmatch(name):
            raise ValueError("expected an environment variable name")
        if SECRET_NAME.fullmatch(name):
            raise ValueError(f"no {name}: a variable named like a secret would be written into a unit file "
                             "readable on the node; give secrets as files (model_hub_token_file, registry_auth_file)")
    return value


EnvMap = Annotated[dict[str, str], AfterValidator(_env_map)]


def is_loopback_host(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
