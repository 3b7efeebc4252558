"""Readers of the control node's private files whose contents the inventory points at: the endpoint's clients file
(``name key`` lines) and an Alertmanager webhook file (one URL). Validation reads them before any connection
(control_files.py); the endpoint and the monitoring host read them to render their configuration. No message ever
holds a key or a URL."""

from __future__ import annotations

import ipaddress
import re

from deploys.schema.endpoint import CLIENT_KEY_MIN_LENGTH

CLIENT_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
CLIENT_KEY = re.compile(r"[A-Za-z0-9._~+/=-]{%d,512}" % CLIENT_KEY_MIN_LENGTH)


class EndpointFileError(ValueError):
    """A control-node endpoint file that cannot be used (the message names the line, never a key)."""


def read_clients(path: str) -> dict[str, str]:
    """``{client name: key}`` from a clients file: one ``name key`` per line, ``#`` comments, blank lines. A
    malformed line, a name or key used twice, or a short key is refused; the message never holds a key."""
    clients: dict[str, str] = {}
    owners: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split() if not line.lstrip().startswith("#") else []
            if not words:
                continue
            if len(words) != 2:
                raise EndpointFileError(f"line {number}: `name key` (two words), not {len(words)} word(s)")
            name, key = words
            # A name is shown only when it cannot be a key: with the columns swapped the first word is the key.
            where = f"line {number}" if CLIENT_KEY.fullmatch(name) else f"line {number} ({name})"
            if not CLIENT_NAME.fullmatch(name):
                raise EndpointFileError(f"line {number}: `name key`, the name first: [a-z0-9][a-z0-9_.-]* (64 "
                                        "characters at most; the first word is not one: are the columns swapped?)")
            if not CLIENT_KEY.fullmatch(key):
                raise EndpointFileError(f"{where}: a key of at least {CLIENT_KEY_MIN_LENGTH} characters "
                                        "[A-Za-z0-9._~+/=-] as the second word (are the columns swapped? `python -m "
                                        "deploys.endpoint_ca --client NAME` makes one)")
            if name in clients:
                raise EndpointFileError(f"{where}: a client named once (it is named twice)")
            if key in owners:
                other = owners[key] if not CLIENT_KEY.fullmatch(owners[key]) else "of another line"
                raise EndpointFileError(f"{where}: the same key as client {other}")
            clients[name], owners[key] = key, name
    if not clients:
        raise EndpointFileError("no client: one `name key` line at least")
    return clients


class WebhookFileError(ValueError):
    """The Alertmanager webhook file does not hold one http(s) URL (the message never shows the URL)."""


# The webhook URL as Python's urlsplit and Go's net/url (Alertmanager's) both read it alike: RFC 3986's grammar,
# narrowed. A host name of letters, digits, `-` and `.`, an IPv4 address or a bracketed IPv6 one (no zone); a port
# of digits; path and query of unreserved and sub-delimiter characters, `:`, `@`, `/`, `?` and whole %-escapes;
# userinfo likewise. No fragment (never sent) and nothing Go refuses that Python takes (a `%` in the host, a space,
# a backslash, a port that is not a number).
_PCHARS = r"(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_WEBHOOK_URL = re.compile(
    r"(?P<scheme>https?)://"
    r"(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|%[0-9A-Fa-f]{2})+@)?"
    rf"(?P<host>\[[0-9A-Fa-f:.]+\]|{_LABEL}(?:\.{_LABEL})*\.?)"
    r"(?::(?P<port>[0-9]{1,5}))?"
    rf"(?P<rest>[/?]{_PCHARS}*)?"
)


def read_webhook_url(path: str) -> str:
    """The one URL of the control-node webhook file (``#`` comments and blank lines ignored). The message never
    shows the URL (a token may be any part of it)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 1:
        raise WebhookFileError(f"one URL (it has {len(lines)} lines)")
    url = lines[0]
    match = _WEBHOOK_URL.fullmatch(url)
    if match is None:
        raise WebhookFileError("an http:// or https:// URL that Alertmanager reads as Python does: a host name, IPv4 "
                               "or [IPv6] address, an optional port, then a path and query of RFC 3986's characters "
                               "and whole %-escapes (no spaces, backslashes, quotes, '#' fragment or '%' in the host)")
    host, port = match["host"], match["port"]
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise WebhookFileError("a URL whose [bracketed] host is an IPv6 address without a zone") from None
    elif re.fullmatch(r"[0-9.]+", host.rstrip(".")):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise WebhookFileError("a URL whose numeric host is an IPv4 address") from None
    if port is not None and not 1 <= int(port) <= 65535:
        raise WebhookFileError("a URL whose port is from 1 to 65535")
    return url
