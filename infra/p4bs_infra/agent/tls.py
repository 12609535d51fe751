"""Test PKI for the router agent: a CA, and a server certificate for the agent's address.

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
from cryptography.x509.oid import NameOID


def _write_key(
    path: Path,
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
    fmt: serialization.PrivateFormat,
) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
    )
    path.chmod(0o600)


def make_test_pki(folder: Path, address: str, netconf_port: int, days: int = 30) -> dict[str, Path]:
    """ca.pem, server.pem, server-key.pem (gNMI TLS), ssh-host-key (NETCONF) and known_hosts
    (the host key for [address]:netconf_port, what NETCONF drivers check) in `folder`."""
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
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p4bs-router")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("p4bs-router"), x509.IPAddress(ipaddress.ip_address(address))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = {
        name: folder / name for name in ("ca.pem", "server.pem", "server-key.pem", "ssh-host-key")
    }
    paths["ca.pem"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["server.pem"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(paths["server-key.pem"], key, serialization.PrivateFormat.PKCS8)
    # paramiko reads traditional OpenSSL-format RSA host keys.
    host_key = rsa.generate_private_key(65537, 2048)
    _write_key(paths["ssh-host-key"], host_key, serialization.PrivateFormat.TraditionalOpenSSL)
    public = host_key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    paths["known_hosts"] = folder / "known_hosts"
    paths["known_hosts"].write_text(f"[{address}]:{netconf_port} {public.decode()}\n")
    return paths
