"""Checks of the files a node's keys name on the control node: the trusted manifest and the secrets (hub
token, registry auth). They run once per host after its keys parse (:func:`control_file_problems`, called
by deploys/schema/parse.py), never inside a field validator: constructing a :class:`NodeConfig` reads no file.

Relative paths (`files/manifests/...`) and "the repository" are the current directory: pyinfra, the
validate CLI and the tests all run from the repository's top.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat

from deploys.schema.control_readers import EndpointFileError, WebhookFileError, read_clients, read_webhook_url
from deploys.schema.node import NodeConfig
from deploys.schema.problems import Problem
from files.model_snapshot.snapshot_manifest import ManifestError, read_manifest


def control_file_problems(host: str, cfg: NodeConfig) -> list[Problem]:
    """Every problem with the control-node files ``cfg`` names (empty when they are all fine)."""
    problems = []
    if not isinstance(cfg, NodeConfig):  # a monitoring-only host (deploys/schema/monitoring.py): its webhook files only
        return [p for key in ("alertmanager_webhook_url_file", "alertmanager_watchdog_url_file")
                if getattr(cfg, key) is not None for p in _webhook_problems(host, key, getattr(cfg, key))]
    if cfg.registry_auth_file is not None:
        problems += _private_file_problems(host, "registry_auth_file", cfg.registry_auth_file)
    if cfg.model_manifest is not None:
        problems += _manifest_problems(host, cfg)
    if cfg.model_hub_token_file is not None:
        problems += _private_file_problems(host, "model_hub_token_file", cfg.model_hub_token_file)
    if cfg.endpoint_enabled:
        problems += _endpoint_problems(host, cfg)
    for key in ("alertmanager_webhook_url_file", "alertmanager_watchdog_url_file"):
        if getattr(cfg, key) is not None:
            problems += _webhook_problems(host, key, getattr(cfg, key))
    return problems


def _webhook_problems(host: str, key: str, path: str) -> list[Problem]:
    """An Alertmanager webhook file (the alerts', the Watchdog's): private, one http(s) URL (never shown: it may carry
    a token)."""
    problems = _private_file_problems(host, key, path)
    if not problems:
        try:
            read_webhook_url(path)
        except WebhookFileError as e:
            problems.append(Problem(host, key, path, str(e)))
    return problems


def _endpoint_problems(host: str, cfg: NodeConfig) -> list[Problem]:
    """The endpoint's certificate, key, CA and client keys: private files (the CA: a public one), each holding
    what it must (:func:`_tls_problems`), client names and keys each unique and well formed, the monitoring
    client among them."""
    problems = []
    for key in ("endpoint_tls_cert", "endpoint_tls_key", "endpoint_clients_file"):
        problems += _private_file_problems(host, key, getattr(cfg, key))
    if cfg.endpoint_tls_ca is not None:
        problems += _public_file_problems(host, "endpoint_tls_ca", cfg.endpoint_tls_ca)
    if problems:
        return problems
    problems += [Problem(host, key, getattr(cfg, key), why) for key, why in _tls_problems(cfg)]
    try:
        clients = read_clients(cfg.endpoint_clients_file)
    except EndpointFileError as e:
        return [*problems, Problem(host, "endpoint_clients_file", cfg.endpoint_clients_file, str(e))]
    if cfg.endpoint_metrics_client is not None and cfg.endpoint_metrics_client not in clients:
        problems.append(Problem(host, "endpoint_metrics_client", cfg.endpoint_metrics_client,
                                f"a client named in {cfg.endpoint_clients_file}"))
    if not [name for name in clients if name != cfg.endpoint_metrics_client]:
        problems.append(Problem(host, "endpoint_clients_file", cfg.endpoint_clients_file,
                                "at least one client besides the monitoring one"))
    return problems


# --------------------------------------------------------------------------------------------------
# What a TLS file must hold. The bar is OpenSSL's default security level on Debian 12/13 and Ubuntu 24.04
# (level 2: RSA and DSA keys of 2048 bits or more, elliptic curves of 224 or more, no MD5 or SHA-1 signature),
# which nginx on the head and every client of the endpoint apply. Messages say what is wrong, never what a file
# holds.

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")


def _pem_labels(path: str) -> list[str]:
    with open(path, "rb") as f:
        return [m.group(1).decode() for m in _PEM_BLOCK.finditer(f.read())]


def _weak_key(public_key) -> str | None:
    """Why OpenSSL's default level refuses this public key (None: it accepts it)."""
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

    if isinstance(public_key, (rsa.RSAPublicKey, dsa.DSAPublicKey)):
        return None if public_key.key_size >= 2048 else f"a {public_key.key_size}-bit key (2048 bits at least)"
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return None if public_key.curve.key_size >= 224 else f"a {public_key.curve.key_size}-bit curve (224 at least)"
    if isinstance(public_key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        return None
    return f"a key of a kind TLS clients refuse ({type(public_key).__name__})"


def _cert_strength(cert) -> str | None:
    if why := _weak_key(cert.public_key()):
        return why
    algorithm = cert.signature_hash_algorithm
    if algorithm is not None and algorithm.name in ("md5", "sha1"):
        return f"a signature OpenSSL accepts ({algorithm.name.upper()} is refused: SHA-256 or better)"
    return None


def _load_certs(path: str) -> tuple[list, str | None]:
    """The certificates of a PEM file that must hold certificates only, or why it cannot be used."""
    from cryptography import x509

    labels = _pem_labels(path)
    if any(label.endswith("PRIVATE KEY") for label in labels):
        return [], ("certificates only: the file holds a private key (a `.key` for a `.crt`?); it is not used, and "
                    "move the key somewhere private")
    if not labels or any(label != "CERTIFICATE" for label in labels):
        return [], "a PEM file of certificates only (`-----BEGIN CERTIFICATE-----` blocks)"
    try:
        with open(path, "rb") as f:
            return x509.load_pem_x509_certificates(f.read()), None
    except ValueError:
        return [], "a PEM file of readable X.509 certificates"


def _tls_problems(cfg: NodeConfig) -> list[tuple[str, str]]:
    """(key, why) for the endpoint's certificate, key and CA: each reported under its own key."""
    import datetime

    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtensionOID

    out: list[tuple[str, str]] = []
    certs, why = _load_certs(cfg.endpoint_tls_cert)
    if why:
        return [("endpoint_tls_cert", why)]
    leaf, chain = certs[0], certs[1:]
    now = datetime.datetime.now(datetime.timezone.utc)
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        out.append(("endpoint_tls_cert", f"a certificate in date (it is valid from {leaf.not_valid_before_utc:%Y-%m-%d} "
                    f"to {leaf.not_valid_after_utc:%Y-%m-%d})"))
    if why := _cert_strength(leaf):
        out.append(("endpoint_tls_cert", f"a certificate OpenSSL's default level accepts: {why}"))
    try:
        names = leaf.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
        addresses = names.get_values_for_type(x509.IPAddress)
    except x509.ExtensionNotFound:
        addresses = []
    if ipaddress.ip_address(cfg.endpoint_address) not in addresses:
        out.append(("endpoint_tls_cert", f"a certificate whose subject alternative names hold endpoint_address "
                    f"{cfg.endpoint_address} (clients check the address they connect to; it names "
                    f"{', '.join(map(str, addresses)) or 'no IP address'}): `python -m deploys.endpoint_ca DIR "
                    f"--address {cfg.endpoint_address}` makes one"))

    labels = _pem_labels(cfg.endpoint_tls_key)
    if [label for label in labels if label.endswith("PRIVATE KEY")] != labels or len(labels) != 1:
        out.append(("endpoint_tls_key", "one PEM private key and nothing else"))
    else:
        try:
            with open(cfg.endpoint_tls_key, "rb") as f:
                key = serialization.load_pem_private_key(f.read(), password=None)
        except TypeError:
            key, why = None, "an unencrypted PEM private key (nginx starts unattended: no passphrase)"
        except (ValueError, UnsupportedAlgorithm):
            key, why = None, "a readable PEM private key"
        if key is None:
            out.append(("endpoint_tls_key", why))
        else:
            public = serialization.PublicFormat.SubjectPublicKeyInfo
            if (key.public_key().public_bytes(serialization.Encoding.PEM, public)
                    != leaf.public_key().public_bytes(serialization.Encoding.PEM, public)):
                out.append(("endpoint_tls_key", "the private key of endpoint_tls_cert (it belongs to another "
                            "certificate)"))

    if cfg.endpoint_tls_ca is not None:
        cas, why = _load_certs(cfg.endpoint_tls_ca)
        if why:
            return [*out, ("endpoint_tls_ca", why)]
        for ca in cas:
            if why := _cert_strength(ca):
                out.append(("endpoint_tls_ca", f"CA certificates OpenSSL's default level accepts: {why}"))
                break
        if not _issued_by(leaf, chain, cas):
            out.append(("endpoint_tls_cert", f"a certificate issued by the CA of endpoint_tls_ca "
                        f"{cfg.endpoint_tls_ca} (clients that trust it would refuse this one)"))
    return out


def _issued_by(leaf, chain: list, cas: list) -> bool:
    """Whether ``leaf`` chains (through the certificate file's own intermediates) to one of ``cas``."""
    current, rest = leaf, list(chain)
    for _ in range(len(chain) + 1):
        for ca in cas:
            if _signed_by(current, ca):
                return True
        parent = next((c for c in rest if _signed_by(current, c)), None)
        if parent is None:
            return False
        rest.remove(parent)
        current = parent
    return False


def _signed_by(cert, issuer) -> bool:
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm

    try:
        cert.verify_directly_issued_by(issuer)
        return True
    except (InvalidSignature, UnsupportedAlgorithm, ValueError, TypeError):  # another issuer, another key kind
        return False


def _manifest_problems(host: str, cfg: NodeConfig) -> list[Problem]:
    """The manifest reads as one (shape and every entry: relative, normalised, inside the snapshot, no
    duplicates) and is the manifest of the pinned repo and commit."""
    try:
        manifest = read_manifest(cfg.model_manifest)
    except ManifestError as e:
        return [Problem(host, "model_manifest", cfg.model_manifest, f"a valid manifest ({e})")]
    if (manifest.get("repo"), manifest.get("commit")) != (cfg.model_repo, cfg.model_revision):
        return [Problem(host, "model_manifest", cfg.model_manifest,
                        f"a manifest of {cfg.model_repo}@{cfg.model_revision}, not "
                        f"{manifest.get('repo')}@{manifest.get('commit')}")]
    return []


def _private_file_problems(host: str, key: str, path: str) -> list[Problem]:
    """A secret on the control node: an existing file, yours (or root's), that only its owner can read, outside
    the repository."""
    if problems := _owned_file_problems(host, key, path):
        return problems
    if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return [Problem(host, key, path, "mode 0600 (it is readable by group or others)")]
    if os.path.realpath(path).startswith(os.path.realpath(os.getcwd()) + os.sep):
        return [Problem(host, key, path, "a path outside the repository (secrets are never committed)")]
    return []


def _public_file_problems(host: str, key: str, path: str) -> list[Problem]:
    """A public file the deploy copies (a CA certificate): an existing file, yours (or root's), that no one else
    can change (its content is checked by what it must hold)."""
    if problems := _owned_file_problems(host, key, path):
        return problems
    if os.stat(path).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return [Problem(host, key, path, "a file only its owner can change (it is writable by group or others)")]
    return []


def _owned_file_problems(host: str, key: str, path: str) -> list[Problem]:
    if not os.path.isfile(path):
        return [Problem(host, key, path, "an existing file on the control node")]
    owner = os.stat(path).st_uid
    if owner not in (os.geteuid(), 0):
        return [Problem(host, key, path, f"a file owned by the user running the deploy (uid {os.geteuid()}) or root, "
                        f"not uid {owner} (another user could have planted or could change it)")]
    return []
