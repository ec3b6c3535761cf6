"""Credentials for a secure Flower deployment, made with the ``cryptography`` package.

Flower's SuperLink serves TLS with a certificate signed by a CA the SuperNodes
and the ``flwr`` CLI trust (``--ssl-*`` / ``--root-certificates``), and, with
``--enable-supernode-auth``, admits only SuperNodes whose public keys were
registered (``flwr supernode register``); a SuperNode signs its requests with its
private key (``--auth-supernode-private-key``). Flower takes those keys as
OpenSSH-encoded EC keys on a NIST curve; P-384 here, as in Flower's guide.

:func:`ensure_credentials` writes what a deployment directory needs —
``ca.crt``/``ca.key`` (kept: a CA given by the user is used, never replaced),
``server.pem``/``server.key`` for the SuperLink's addresses, and one key pair per
SuperNode. Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from hetfed.errors import RunError

#: addresses that mean "listen everywhere": no certificate can name them
WILDCARD = ("0.0.0.0", "::")

#: how long generated certificates are valid (a simulation deployment is short-lived; a real one rotates)
VALID_DAYS = 365


@dataclass(frozen=True)
class Credentials:
    """Paths of one deployment's TLS and node-authentication files."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    node_keys: tuple[tuple[Path, Path], ...]  # (private, public) per SuperNode


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _name(common: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hetfed"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(directory: Path) -> tuple[Path, Path]:
    """A self-signed CA (``ca.crt``, ``ca.key``) — or the one already in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert_path, key_path = directory / "ca.crt", directory / "ca.key"
    if cert_path.is_file() and key_path.is_file():
        return cert_path, key_path
    if cert_path.is_file() != key_path.is_file():
        raise RunError(f"{directory} holds only one of ca.crt and ca.key: a CA needs both (or remove the one to "
                       "have a new CA made)")
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("hetfed deployment CA")).issuer_name(_name("hetfed deployment "
                                                                                                    "CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def make_server_cert(directory: Path, ca_cert: Path, ca_key: Path, hosts: list[str]) -> tuple[Path, Path]:
    """``server.pem``/``server.key`` signed by the CA, valid for ``hosts`` (IP addresses or DNS names)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):  # the CA hetfed writes (make_ca) signs with EC keys
        raise ValueError(f"{ca_key}: expected the EC private key of hetfed's CA, found {type(signer).__name__}")
    key = ec.generate_private_key(ec.SECP384R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(signer, hashes.SHA256()))
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def make_node_key(directory: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's key pair in OpenSSH format (``NAME.key``, ``NAME.pub``) — kept when it exists."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private, public = directory / f"{name}.key", directory / f"{name}.pub"
    if private.is_file() and public.is_file():
        return private, public
    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
                       + f" hetfed-{name}\n".encode())
    return private, public


def ensure_credentials(directory: str | Path, n_nodes: int, hosts: list[str] | None = None) -> Credentials:
    """Everything a secure deployment with ``n_nodes`` SuperNodes needs, under ``directory`` (made if missing)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca(d)
    names = [h for h in dict.fromkeys(hosts or ["127.0.0.1", "localhost", "::1"]) if h not in WILDCARD]
    server_cert, server_key = make_server_cert(d, ca_cert, ca_key, names)
    nodes = tuple(make_node_key(d, f"supernode-{k}") for k in range(n_nodes))
    return Credentials(ca_cert, server_cert, server_key, nodes)
