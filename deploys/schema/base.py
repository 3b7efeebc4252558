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

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from deploys.unit_text import ENV_NAME
from files.model_snapshot.snapshot_manifest import SAFE_PATH

HEX40 = re.compile(r"[0-9a-f]{40}")  # patterns are used with fullmatch: `$` would accept a trailing newline
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

# Directories a container mount point must never be (or cover).
SYSTEM_DIRS = frozenset({"/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/var", "/run", "/boot", "/root"})

# --------------------------------------------------------------------------------------------------
# Path kinds: what each path-valued key may name (see ``PathKind`` and the key table of docs/inventory-keys.md)

# Trees a directory the toolkit creates, chmods, mounts writable or deletes from is never in (nor above):
# the system's own files, the package managers' and container engines' state, world-writable temp trees (any
# user can plant a link where root then writes) and the toolkit's own state (deploys/*.py own those paths).
FORBIDDEN_TREES = (
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/efi", "/dev", "/proc", "/sys",
    "/run", "/snap", "/lost+found", "/tmp", "/var/tmp", "/var/lib/dpkg", "/var/lib/apt", "/var/cache/apt",
    "/var/lib/containers", "/var/lib/docker", "/var/lib/systemd", "/var/log", "/var/spool", "/var/mail",
    "/var/lib/inference-nodes", "/var/cache/inference-nodes/wheels",
)
# Directories other software and users share: a directory key may name one below them, never one of them.
SHARED_DIRS = frozenset({
    "/", "/home", "/root", "/srv", "/opt", "/mnt", "/media", "/data", "/scratch", "/var", "/var/lib", "/var/cache",
    "/var/opt", "/var/local", "/opt/inference-nodes", "/var/cache/inference-nodes",
})
# Path components that hold a user's credentials or configuration (`/root/.ssh`, `/home/ops/.config/...`).
PRIVATE_COMPONENTS = re.compile(r"\.(ssh|gnupg|config|docker|kube|aws|pki|password-store)")
# The hub client's venv is the toolkit's alone: `--clear` empties it, so it lives under this root.
TOOLKIT_VENV_ROOT = "/opt/inference-nodes"

# Variable names that carry secrets belong in the secret-file keys, never in a unit or env file.
# Matched on the name's `_`-separated words: HF_TOKEN and DB_PASSWORD are secrets, MAX_NUM_BATCHED_TOKENS is not.
SECRET_NAME = re.compile(
    r"(?i)(.*[_-])?(TOKEN|PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIALS?|APIKEY|AUTH|COOKIE"
    r"|(API|PRIVATE|ACCESS|SECRET)[_-]KEY)([_-].*)?"
)


class KeyRuleError(ValueError):
    """Raised inside a validator so the problem names the key a (cross-field) rule is about. Its own message never
    holds the value (a secret under a harmless name): the problem it becomes shows the value as
    deploys/schema/problems.py's ``shown_value`` allows."""

    def __init__(self, key: str, value: Any, expected: str):
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"{key}: expected {expected}")


class ComponentKeys(BaseModel):
    """The base of every component's keys: unknown keys are errors, values frozen, no inf/nan, and no
    true/false where a number belongs (pydantic's lax mode reads `[True]` as `[1]`: GPU 1, silently)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if field is not None and _number_not_bool(field.annotation) and _holds_bool(value):
                    raise KeyRuleError(key, value, "numbers, not true/false (a boolean would be read as 1 or 0)")
        return data


def _number_not_bool(annotation: Any) -> bool:
    """Whether the annotation takes numbers (alone, in a list, as dict values) and never a boolean."""
    import typing

    args = typing.get_args(annotation)
    if annotation is bool or bool in args:
        return False
    if annotation in (int, float):
        return True
    return any(_number_not_bool(a) for a in args if a is not str)


def _holds_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_bool(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_bool(v) for v in value.values())
    return False


def _key(default: Any = ..., description: str = "", **kw: Any) -> Any:
    """A schema key: its default and the one-line meaning shown in the key table (docs/inventory-keys.md)."""
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


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def owned_dir_problem(path: str, trees: tuple[str, ...] = FORBIDDEN_TREES) -> str | None:
    """Why ``path`` cannot be a directory the toolkit creates, chmods, mounts writable or deletes from (None:
    it can). Refused: a system, package, container-engine, temp or toolkit-state tree (or a path above one), a
    directory others share (`/srv`, `/home`, `/opt`, a home directory itself), and credential folders."""
    for tree in trees:
        if _under(path, tree) or _under(tree, path):
            return f"a directory of its own, outside {tree} (the toolkit writes, mounts or deletes there as root)"
    parts = PurePosixPath(path).parts
    if path in SHARED_DIRS or (len(parts) == 3 and parts[1] == "home"):
        return (f"a directory of its own below {path}, not {path} itself (other software and users keep files "
                "there; the toolkit writes, mounts or deletes as root)")
    if any(PRIVATE_COMPONENTS.fullmatch(p) for p in parts):
        return "a directory outside a user's credentials and configuration (.ssh, .gnupg, .config, ...)"
    return None


class PathKind:
    """What a path-valued key may name. Each key's kind is in its type (``Annotated[str, kind]``), so the
    rule is checked where the key parses and shown in the key table of docs/inventory-keys.md (``rule``)."""

    def __init__(self, name: str, rule: str, check=None):
        self.name, self.rule, self._check = name, rule, check

    def __call__(self, value: str) -> str:
        value = _absolute(value)
        if self._check and (why := self._check(value)):
            raise ValueError(why)
        return value


def _under_one_of(*roots: str, what: str):
    def check(path: str) -> str | None:
        if not any(path.startswith(r.rstrip("/") + "/") for r in roots):
            return f"{what} under {' or '.join(r + '/' for r in roots)}"
        return None
    return check


def _venv_check(path: str) -> str | None:
    return _under_one_of(TOOLKIT_VENV_ROOT, what="a directory")(path) and (
        f"a directory under {TOOLKIT_VENV_ROOT}/ (the deploy empties it with `python3 -m venv --clear`: only a "
        "directory of the toolkit's own may be cleared)")


# Directories the toolkit owns: it creates them, chmods them, mounts them writable, deletes what it does not
# list (the model directory: only once it carries the toolkit's marker, deploys/model/snapshot.py).
OWNED_DIR = PathKind("owned_dir", "an absolute directory of its own: not a system, temp, package or toolkit-state "
                     "tree, not a shared one (`/srv`, `/opt`, `/home/<user>`), nor a credential folder",
                     owned_dir_problem)
HUB_VENV = PathKind("hub_venv", f"a directory under `{TOOLKIT_VENV_ROOT}/` (emptied by `venv --clear`)", _venv_check)
# The control node's own download cache: the same rule, but below the temp trees too (it is the admin's
# machine and user; `/tmp` itself is still refused as a shared directory).
CONTROL_DIR = PathKind("control_dir", "an absolute control-node directory of its own (not a system or shared one)",
                       lambda p: owned_dir_problem(p, tuple(t for t in FORBIDDEN_TREES if t not in ("/tmp", "/var/tmp")))
                       or (f"a directory below {p}, not {p} itself" if p in ("/tmp", "/var/tmp") else None))
# Files the toolkit writes whole as root, each under its own folder.
def _fabric_env_file_check(path: str) -> str | None:
    if why := _under_one_of("/etc/inference-nodes", what="a file")(path):
        return why
    if not path.endswith(".env") or path.endswith(".service.env") or _under(path, "/etc/inference-nodes/secrets"):
        return ("a `.env` file of its own under /etc/inference-nodes/ (not in secrets/, not `*.service.env`: the "
                "toolkit's own files)")
    return None


FABRIC_ENV_FILE = PathKind("env_file", "a `.env` file under `/etc/inference-nodes/` (not in `secrets/`, not "
                           "`*.service.env`); written 0600 as root", _fabric_env_file_check)
CDI_SPEC_FILE = PathKind("cdi_spec", "a `.yaml` or `.json` file under `/etc/cdi/` or `/var/run/cdi/` (CDI's spec dirs)",
                         lambda p: _under_one_of("/etc/cdi", "/var/run/cdi", "/run/cdi", what="a file")(p)
                         or (None if p.endswith((".yaml", ".json")) else "a .yaml or .json file name"))
# Devices passed into the container.
DEVICE = PathKind("device", "a path under `/dev/`", _under_one_of("/dev", what="a device"))
# Trees the toolkit only reads (sysfs, procfs or the sandbox's stand-ins).
READ_ONLY_ROOT = PathKind("read_only", "an absolute path the toolkit only reads")
# Paths inside the container (checked against each other and the image's system directories).
CONTAINER_PATH = PathKind("container_path", "an absolute path inside the container, not / or a system directory")
# Control-node paths: a secret file (checked once the keys parse: what it holds, exists, 0600, the user's own,
# outside the repo), a public file the toolkit reads there (a CA certificate: what it holds, not writable by
# others), or a cache. A value of a control-file key that is not a path is never shown: it may be the secret.
CONTROL_SECRET = PathKind("control_secret", "a control-node file, mode 0600, owned by you (or root), outside the "
                          "repository")
CONTROL_FILE = PathKind("control_file", "a control-node file, owned by you (or root), writable by its owner alone")

OwnedDir = Annotated[str, AfterValidator(OWNED_DIR)]
ControlDir = Annotated[str, AfterValidator(CONTROL_DIR)]
HubVenv = Annotated[str, AfterValidator(HUB_VENV)]
FabricEnvFile = Annotated[str, AfterValidator(FABRIC_ENV_FILE)]
CdiSpecFile = Annotated[str, AfterValidator(CDI_SPEC_FILE)]
DevicePath = Annotated[str, AfterValidator(DEVICE)]
ReadOnlyRoot = Annotated[str, AfterValidator(READ_ONLY_ROOT)]
ContainerPath = Annotated[str, AfterValidator(CONTAINER_PATH)]
ControlSecret = Annotated[str, AfterValidator(CONTROL_SECRET)]
ControlFile = Annotated[str, AfterValidator(CONTROL_FILE)]


def path_kind(annotation: Any) -> PathKind | None:
    """The PathKind a field's annotation carries (``X | None`` and ``list[X]`` included), else None."""
    import typing

    for meta in getattr(annotation, "__metadata__", ()):
        if isinstance(getattr(meta, "func", None), PathKind):
            return meta.func
    for arg in typing.get_args(annotation):
        if kind := path_kind(arg):
            return kind
    return None


def _env_map(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if not ENV_NAME.fullmatch(name):
            raise ValueError("expected an environment variable name")
        if SECRET_NAME.fullmatch(name):
            raise ValueError(f"no {name}: a variable named like a secret would be written into a unit file "
                             "readable on the node; give secrets as files (model_hub_token_file, registry_auth_file)")
    return value


EnvMap = Annotated[dict[str, str], AfterValidator(_env_map)]


# A Debian package name as apt takes it on the command line: no version, option or shell syntax.
DEB_PACKAGE = re.compile(r"[a-z0-9][a-z0-9.+-]+")

# Characters a URL key may hold: RFC 3986's, less those a shell, an apt source or a unit file reads specially.
_URL_CHARS = re.compile(r"[A-Za-z0-9._~:/?#\[\]!&()*+,;=%-]+")


def _url(value: str) -> str:
    from urllib.parse import urlsplit

    if not _URL_CHARS.fullmatch(value):
        raise ValueError("a URL of letters, digits and . _ ~ : / ? # [ ] ! & ( ) * + , ; = % - only (no spaces, "
                         "quotes, '$', '@', '\\' or backticks)")
    url = urlsplit(value)
    if "@" in url.netloc:  # (refused above too: '@' is not in the set; kept for the message's sake)
        raise ValueError("a URL without credentials")
    if url.scheme != "file" and not url.hostname:
        raise ValueError("a URL with a host")
    return value


# A URL the toolkit writes into apt sources, env files and commands: never credentials (`user:pass@host` would
# land in 0644 files and in logs; the hub token and registry credentials are files of their own).
Url = Annotated[str, AfterValidator(_url)]


def _ip_address(value: str) -> str:
    """An IP address as every consumer reads it alike: parsed, in its one canonical spelling (so two keys naming one
    address hold the same text), without an IPv6 zone (`%eth0`: text that would reach nginx.conf and unit files)
    and not IPv4-mapped (`::ffff:127.0.0.1` is loopback and `::ffff:0.0.0.0` a wildcard in disguise)."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError("an IP address, IPv4 or IPv6 (like 192.0.2.10 or 2001:db8::10)") from None
    if getattr(address, "scope_id", None) is not None:
        raise ValueError("an IP address without a zone (no '%' and interface name)")
    if getattr(address, "ipv4_mapped", None) is not None:
        raise ValueError(f"an IPv4 address as itself ({address.ipv4_mapped}), not IPv4-mapped IPv6")
    if str(address) != value:
        raise ValueError(f"the address in canonical form ({address})")
    return value


# Every address-valued key: text that is its address's canonical spelling (``ipaddress.ip_address(v)`` gives
# the value; equal text means the same address, so the per-host table of deploys/schema/listeners.py compares
# them as such).
IpAddress = Annotated[str, AfterValidator(_ip_address)]


def is_loopback_host(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
