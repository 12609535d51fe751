"""Test PKI for the router agent: a CA, a server certificate for the agent's address and a
client certificate for gNMI with mutual TLS.

An operator's routers use the operator's PKI; the testbed makes its own so that gNMI runs over
real TLS that clients verify against `ca.pem`.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write_key(
    path: Path,
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
    fmt: serialization.PrivateFormat,
) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _signed(
    name: str,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
    usage: x509.ObjectIdentifier,
    alt_names: list[x509.GeneralName],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A key and a certificate for `name`, signed by the CA, for one use (server or client)."""
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_test_pki(folder: Path, address: str, netconf_port: int, days: int = 30) -> dict[str, Path]:
    """In `folder`: ca.pem; server.pem and server-key.pem (the agent's gNMI TLS, for the
    name p4bs-router and `address`); client.pem and client-key.pem (a certificate a gNMI
    client presents where the agent requires one); ssh-host-key (NETCONF) and known_hosts
    (that host key for [address]:netconf_port, what NETCONF drivers check)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p4bs testbed CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server, server_key = _signed(
        "p4bs-router",
        ca,
        ca_key,
        days,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("p4bs-router"), x509.IPAddress(ipaddress.ip_address(address))],
    )
    client, client_key = _signed(
        "p4bs-optimizer", ca, ca_key, days, ExtendedKeyUsageOID.CLIENT_AUTH, []
    )
    names = ("ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")
    paths = {name: folder / name for name in (*names, "ssh-host-key", "known_hosts")}
    for name, cert in (("ca.pem", ca), ("server.pem", server), ("client.pem", client)):
        paths[name].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    for name, key in (("server-key.pem", server_key), ("client-key.pem", client_key)):
        _write_key(paths[name], key, serialization.PrivateFormat.PKCS8)
    # paramiko reads traditional OpenSSL-format RSA host keys.
    host_key = rsa.generate_private_key(65537, 2048)
    _write_key(paths["ssh-host-key"], host_key, serialization.PrivateFormat.TraditionalOpenSSL)
    public = host_key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    paths["known_hosts"].write_text(f"[{address}]:{netconf_port} {public.decode()}\n")
    return paths
