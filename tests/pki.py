"""Certificates made in the test: a CA, server and client certificates it signs (valid, expired, not yet valid,
for another name), written as PEM files the way cert-manager lays them out (tls.crt, tls.key, ca.crt)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = "127.0.0.1"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass
class Issued:
    """A certificate and its key on disk."""

    cert: Path
    key: Path
    serial: int
    not_before: float  # Unix seconds, as written into the certificate (to the second)
    not_after: float


class CA:
    """A self-signed CA in `directory`/`name`.crt that issues leaf certificates."""

    def __init__(self, directory: Path, name: str = "ca") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(_name(f"gpumond test {name}"))
                     .issuer_name(_name(f"gpumond test {name}")).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                                  key_encipherment=False, data_encipherment=False,
                                                  key_agreement=False, key_cert_sign=True, crl_sign=True,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.path = directory / f"{name}.crt"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, stem: str, *, client: bool = False, expired: bool = False, not_yet_valid: bool = False,
              days: int = 7, host: str = LOOPBACK, directory: Path | None = None) -> Issued:
        """A leaf certificate for `host` (server) or a client, signed by this CA, as stem.crt / stem.key: valid
        from an hour ago for `days`, or expired a day ago, or valid only from tomorrow."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        if expired:
            start, end = now - dt.timedelta(days=10), now - dt.timedelta(days=1)
        elif not_yet_valid:
            start, end = now + dt.timedelta(days=1), now + dt.timedelta(days=8)
        else:
            start, end = now - dt.timedelta(hours=1), now + dt.timedelta(days=days)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        serial = x509.random_serial_number()
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        cert = (x509.CertificateBuilder().subject_name(_name(f"{stem} {host}")).issuer_name(self.cert.subject)
                .public_key(key.public_key()).serial_number(serial).not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName([san]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(self.key, hashes.SHA256()))
        out = directory or self.dir
        out.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = out / f"{stem}.crt", out / f"{stem}.key"
        key_path.write_bytes(_key_pem(key))
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return Issued(cert_path, key_path, serial, float(int(start.timestamp())), float(int(end.timestamp())))
