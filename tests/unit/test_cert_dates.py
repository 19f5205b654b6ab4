"""A certificate's validity dates read from its PEM (gpumond/web/certdates.py), checked against what the openssl
command line says of certificates it made itself, both DER time forms included, and refused when unreadable."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from gpumond.web.certdates import CertificateDateError, Validity, validity
from tests.pki import CA

OPENSSL = shutil.which("openssl")


def openssl_made(tmp_path: Path, days: int) -> Path:
    """A self-signed certificate the openssl command line makes, valid from now for `days`."""
    assert OPENSSL, "openssl is installed by scripts/test.sh"
    cert = tmp_path / f"{days}.crt"
    subprocess.run([OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", str(days), "-subj", "/CN=127.0.0.1", "-keyout", str(tmp_path / f"{days}.key"),
                    "-out", str(cert)], check=True, capture_output=True, timeout=30)
    return cert


def openssl_dates(cert: Path) -> tuple[float, float]:
    out = subprocess.run([OPENSSL, "x509", "-in", str(cert), "-noout", "-startdate", "-enddate"], check=True,
                         capture_output=True, text=True, timeout=30).stdout
    fields = dict(line.split("=", 1) for line in out.splitlines())
    return ssl.cert_time_to_seconds(fields["notBefore"]), ssl.cert_time_to_seconds(fields["notAfter"])


# 30 days: UTCTime (YYMMDD…); 30,000 days: past 2049, so GeneralizedTime (YYYYMMDD…), RFC 5280 4.1.2.5
@pytest.mark.parametrize("days", [30, 30_000])
def test_the_dates_are_what_openssl_says(tmp_path: Path, days: int) -> None:
    cert = openssl_made(tmp_path, days)
    assert validity(cert.read_text()) == Validity(*openssl_dates(cert))


def test_the_first_certificate_of_a_chain_is_the_one_read(tmp_path: Path) -> None:
    ca = CA(tmp_path)
    leaf = ca.issue("tls", expired=True)
    chain = leaf.cert.read_text() + ca.path.read_text()  # the leaf, then its issuer, as cert_file holds them
    assert validity(chain) == Validity(leaf.not_before, leaf.not_after)


def test_expired_and_not_yet_valid_are_said_with_the_date() -> None:
    v = Validity(not_before=1_000_000_000.0, not_after=2_000_000_000.0)
    assert v.problem(1_500_000_000.0) is None
    assert v.problem(2_000_000_001.0) == "expired on 2033-05-18T03:33:20Z"
    assert v.problem(999_999_999.0) == "is not valid until 2001-09-09T01:46:40Z"


@pytest.mark.parametrize("text", ["not a certificate\n",
                                  "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n"])
def test_an_unreadable_certificate_is_an_error_not_a_guess(text: str) -> None:
    with pytest.raises(CertificateDateError):
        validity(text)
