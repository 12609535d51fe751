"""Local PKI for the servers the project starts: a CA and certificates signed by it.

An operator's routers and Kafka cluster use the operator's PKI; the testbed (the router
agent's gNMI, with a client certificate for mutual TLS) and the local stack (a secured Kafka
broker) make their own, so that their clients verify real TLS against `ca.pem`. Every key
file is readable by its owner only; a server that takes a password-protected keystore
(Kafka) gets one, the others PEM keys.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write_private(path: Path, data: bytes) -> None:
    path.touch(mode=0o600)
    path.chmod(0o600)  # before the key is in it, also when the file was there
    path.write_bytes(data)


def _write_key(
    path: Path,
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
    fmt: serialization.PrivateFormat,
) -> None:
    _write_private(
        path, key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca(name: str, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _signed(
    name: str,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    days: int,
    usages: Sequence[x509.ObjectIdentifier],
    alt_names: list[x509.GeneralName],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A key and a certificate for `name`, signed by the CA, for its uses (server, client)."""
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
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
    ca, ca_key = _ca("p4bs testbed CA", days)
    server, server_key = _signed(
        "p4bs-router",
        ca,
        ca_key,
        days,
        [ExtendedKeyUsageOID.SERVER_AUTH],
        [x509.DNSName("p4bs-router"), x509.IPAddress(ipaddress.ip_address(address))],
    )
    client, client_key = _signed(
        "p4bs-optimizer", ca, ca_key, days, [ExtendedKeyUsageOID.CLIENT_AUTH], []
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


def server_pki(
    folder: Path,
    ca_name: str,
    server_name: str,
    addresses: Sequence[str],
    days: int,
    keystore_password: str,
) -> dict[str, Path]:
    """In `folder`: a new CA (`ca.pem`) and, in the PKCS#12 keystore `server.p12` encrypted
    with `keystore_password`, a key and a certificate for `server_name` at `addresses` (IP
    literals or DNS names) signed by it, for both TLS uses: the server presents it to its
    clients and as a client (Kafka's broker to its own controller)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca(ca_name, days)
    alt_names: list[x509.GeneralName] = [x509.DNSName(server_name)]
    for address in addresses:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            alt_names.append(x509.DNSName(address))
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert, key = _signed(server_name, ca, ca_key, days, usages, alt_names)
    paths = {"ca.pem": folder / "ca.pem", "server.p12": folder / "server.p12"}
    paths["ca.pem"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    encryption = serialization.BestAvailableEncryption(keystore_password.encode())
    keystore = pkcs12.serialize_key_and_certificates(
        server_name.encode(), key, cert, [ca], encryption
    )
    _write_private(paths["server.p12"], keystore)
    return paths
