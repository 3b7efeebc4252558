"""The one writer for values that reach systemd / Quadlet unit files (`Exec=`, `Environment=`, ...) and
the env files Podman reads.

systemd (and Quadlet, which splits `Exec=` and `Environment=` the same way before writing `ExecStart=`)
splits on whitespace, honours double quotes and C escapes, expands `%` specifiers and `$VAR` in
`ExecStart=`. Every argument goes through :func:`unit_word`: quoted, `\\`, `"` escaped, `%` and `$`
doubled. Control characters cannot be escaped safely in every consumer and are refused.

The schema refuses the same characters (:func:`unprintable`) and variable names (:data:`ENV_NAME`) in
inventory values, so a bad value is named at validation, before any host changes; this module is where
both are defined.
"""

from __future__ import annotations

import re
import unicodedata

_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # used with fullmatch: `$` would accept a trailing newline


class UnitValueError(ValueError):
    """A value that cannot be written into a unit file."""


def unprintable(text: str) -> bool:
    """Control (C0, DEL, C1), format (zero-width, bidi override) and line/paragraph separator characters:
    no unit file, env file, shell or terminal reads them back as written."""
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text)


def refuse_control(value: str) -> str:
    if unprintable(value):
        raise UnitValueError(f"{value!r} contains a control character (newline, tab, zero-width or bidi mark, ...)")
    return value


def _env_name(name: str) -> str:
    if not ENV_NAME.fullmatch(name):
        raise UnitValueError(f"{name!r} is not an environment variable name")
    return name


def unit_word(value: str) -> str:
    """One word of a systemd command line or assignment list, exactly as systemd will read it back."""
    refuse_control(value)
    value = value.replace("%", "%%").replace("$", "$$")
    if value and _PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


LONE_SEMICOLON = ";"


def command_line(argv: list[str]) -> str:
    """An `Exec=`-style command line. An empty argument is refused: Podman's Quadlet generator drops it and
    every argument after it (seen with Podman 5.4's generator). So is an argument that is exactly `;`: written
    quoted it is right for systemd, but Quadlet 4.9.3 splits `Exec=` and writes that word back bare into
    `ExecStart=`, where systemd reads it as a command separator (mid-line the unit is refused, at the end
    the `;` vanishes)."""
    if any(a == "" for a in argv):
        raise UnitValueError(f"an empty argument in {argv!r}")
    if LONE_SEMICOLON in argv:
        raise UnitValueError("an argument that is exactly ';' (Quadlet writes it back as a command separator)")
    return " ".join(unit_word(a) for a in argv)


def environment_line(name: str, value: str) -> str:
    """`Environment=` with one assignment, however the value looks."""
    return f"Environment={unit_word(f'{_env_name(name)}={value}')}\n"


def env_file_line(name: str, value: str) -> str:
    """One `NAME=value` line of an env file Podman reads (Quadlet `EnvironmentFile=` in `[Container]` is
    `podman --env-file`): Podman takes the value verbatim after the first `=` (no quotes, no escapes), so
    only a control character could change what it reads, and that is refused."""
    return f"{_env_name(name)}={refuse_control(value)}\n"


def confined(capabilities: str = "") -> str:
    """The `[Service]` sandboxing lines of a network service the toolkit runs as its own unit (the endpoint's
    nginx, Prometheus, Alertmanager): a read-only system, no home, devices, kernel tunables or modules, IP and unix
    sockets only, and only ``capabilities`` (none by default)."""
    return ("NoNewPrivileges=yes\nProtectSystem=strict\nProtectHome=yes\nPrivateTmp=yes\nPrivateDevices=yes\n"
            "ProtectKernelTunables=yes\nProtectKernelModules=yes\nProtectControlGroups=yes\n"
            "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX\n"
            f"CapabilityBoundingSet={capabilities}\nLockPersonality=yes\n")
