"""A small lab CA for the endpoints, and client keys: what the inventory's endpoint files name when a lab has no
certificate of its own.

    python -m deploys.endpoint_ca DIR --address 192.0.2.10 [--dns compute.home.arpa] [--client alice ...]

Writes into DIR (made 0700; every file 0600, the CA certificate 0644 since clients need it):

- ``ca.crt`` / ``ca.key``: the lab CA (EC P-256, ten years), made once and reused: every endpoint certificate made
  from DIR is signed by it, so clients trust one file (``curl --cacert DIR/ca.crt``, ``SSL_CERT_FILE``,
  OpenAI's ``http_client=httpx.Client(verify="DIR/ca.crt")``);
- ``<address>.crt`` / ``<address>.key``: the endpoint's certificate (two years) for the address and any
  ``--dns`` names, made when missing or when it no longer covers them;
- ``clients``: ``name key`` lines; ``--client NAME`` adds NAME with a new random key (43 characters) where the
  file has no such client. Keys are never printed.

Then set ``endpoint_tls_cert``, ``endpoint_tls_key``, ``endpoint_tls_ca`` and ``endpoint_clients_file`` to these
paths. DIR must be outside the repository (the inventory check refuses secrets inside it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import ipaddress
import os
import secrets
import sys

from deploys.schema.control_readers import CLIENT_NAME

CA_DAYS, CERT_DAYS = 3650, 730


def _write(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with ``mode`` from the start (never readable by others on the way)."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(directory: str):
    """``directory`` (made 0700 when missing) held by this process alone: two runs never write its files at once."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _name(common: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load(cert_path: str, key_path: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    with open(cert_path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    with open(key_path, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    return cert, key


def lab_ca(directory: str):
    """The lab CA of ``directory`` (made on first use): (certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert_path, key_path = f"{directory}/ca.crt", f"{directory}/ca.key"
    if os.path.exists(cert_path) and os.path.exists(key_path):
        return _load(cert_path, key_path)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    name = _name(f"inference-nodes lab CA {secrets.token_hex(4)}")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(key_path, _pem_key(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def endpoint_certificate(directory: str, address: str, dns: list[str]) -> tuple[str, str]:
    """The endpoint certificate for ``address`` (and ``dns`` names) signed by the lab CA: (cert path, key path);
    made again when missing, expiring within 30 days, or not covering every name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ip = ipaddress.ip_address(address)
    cert_path, key_path = f"{directory}/{ip}.crt", f"{directory}/{ip}.key"
    wanted = {x509.IPAddress(ip), *(x509.DNSName(d) for d in dns)}
    now = datetime.datetime.now(datetime.timezone.utc)
    if os.path.exists(cert_path) and os.path.exists(key_path):
        cert, _ = _load(cert_path, key_path)
        names = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
        if wanted <= names and cert.not_valid_after_utc > now + datetime.timedelta(days=30):
            return cert_path, key_path
    ca_cert, ca_key = lab_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(dns[0] if dns else str(ip))).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName(sorted(wanted, key=str)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(key_path, _pem_key(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o600)
    return cert_path, key_path


def add_clients(path: str, names: list[str]) -> list[str]:
    """Add each of ``names`` with a new random key to the clients file at ``path`` (made 0600 when missing) where it
    has no such client; returns the names added. Keys are never printed."""
    existing = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    have = {line.split()[0] for line in existing.splitlines() if line.split() and not line.startswith("#")}
    added = []
    for name in names:
        if not CLIENT_NAME.fullmatch(name):
            raise SystemExit(f"--client {name!r}: a name of [a-z0-9][a-z0-9_.-]* (64 at most)")
        if name not in have:
            existing += f"{name} {secrets.token_urlsafe(32)}\n"
            have.add(name)
            added.append(name)
    if added or not os.path.exists(path):
        _write(path, existing.encode(), 0o600)
    return added


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploys.endpoint_ca", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--address", action="append", default=[], help="an endpoint address (repeat for several)")
    parser.add_argument("--dns", action="append", default=[], help="a DNS name every certificate also covers")
    parser.add_argument("--client", action="append", default=[], help="a client to give a key (repeatable)")
    args = parser.parse_args(argv)
    directory = os.path.abspath(args.directory)
    if directory.startswith(os.path.realpath(os.getcwd()) + os.sep) and os.path.exists("deploys/endpoint_ca.py"):
        print(f"{directory}: inside the repository; keep secrets outside it", file=sys.stderr)
        return 2
    with locked(directory):
        os.chmod(directory, 0o700)
        lab_ca(directory)
        print(f"CA: {directory}/ca.crt (clients verify the endpoints with it)")
        for address in args.address:
            cert, key = endpoint_certificate(directory, address, args.dns)
            print(f"endpoint {address}: endpoint_tls_cert {cert}, endpoint_tls_key {key}")
        if args.client:
            added = add_clients(f"{directory}/clients", args.client)
            print(f"clients: {directory}/clients ({', '.join(added) or 'no new client'} added; keys are in the file)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
