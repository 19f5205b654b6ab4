"""The validity period (not before, not after) of the first certificate in a PEM file: the one a server presents.

The ssl module loads a certificate without looking at its dates and offers no public way to read them back
from a context; `cryptography` would, but is a large dependency for two fields. The fields sit at a fixed
place in the DER (RFC 5280 4.1): Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
serialNumber, signature, issuer, validity SEQUENCE { notBefore, notAfter }, … } … }, each time a UTCTime
(YYMMDDHHMMSSZ; years 50-99 are 19xx) or a GeneralizedTime (YYYYMMDDHHMMSSZ). Only this path is walked.
"""

from __future__ import annotations

import calendar
import re
import ssl
import time
from dataclasses import dataclass

_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE, _VERSION, _UTC_TIME, _GENERALIZED_TIME = 0x30, 0xA0, 0x17, 0x18


class CertificateDateError(ValueError):
    """The file holds no certificate whose dates can be read."""


@dataclass(frozen=True, slots=True)
class Validity:
    """When a certificate may be used, in Unix seconds."""

    not_before: float
    not_after: float

    def problem(self, now: float) -> str | None:
        """Why the certificate cannot be used at `now` (expired, not yet valid), or None."""
        if now > self.not_after:
            return f"expired on {utc(self.not_after)}"
        if now < self.not_before:
            return f"is not valid until {utc(self.not_before)}"
        return None


def utc(seconds: float) -> str:
    """Unix seconds as an ISO 8601 UTC time to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def validity(pem: str) -> Validity:
    """The validity period of the first certificate in `pem` (a certificate file's text, perhaps a chain)."""
    found = _PEM.search(pem)
    if found is None:
        raise CertificateDateError("no PEM certificate")
    try:
        der = ssl.PEM_cert_to_DER_cert(found.group(0))
        _, cert, _ = _element(der, 0, _SEQUENCE)
        _, at, _ = _element(der, cert, _SEQUENCE)  # tbsCertificate's contents
        if der[at] == _VERSION:
            at = _element(der, at)[2]
        for _ in range(3):  # serialNumber, signature, issuer
            at = _element(der, at)[2]
        _, at, _ = _element(der, at, _SEQUENCE)  # validity's contents
        not_before, at = _time(der, at)
        not_after, _ = _time(der, at)
    except (ValueError, IndexError) as e:
        raise CertificateDateError(f"cannot read its validity dates ({e})") from None
    return Validity(not_before, not_after)


def _element(der: bytes, at: int, tag: int | None = None) -> tuple[int, int, int]:
    """(tag, where its contents start, where it ends) of the DER element at `at`."""
    found = der[at]
    if tag is not None and found != tag:
        raise ValueError(f"tag {found:#x} at {at}, expected {tag:#x}")
    length, start = der[at + 1], at + 2
    if length & 0x80:  # long form: the next (length & 0x7f) bytes are the length
        n = length & 0x7F
        length, start = int.from_bytes(der[start:start + n], "big"), start + n
    if start + length > len(der):
        raise ValueError(f"element at {at} runs past the end")
    return found, start, start + length


def _time(der: bytes, at: int) -> tuple[float, int]:
    """A UTCTime or GeneralizedTime at `at` as Unix seconds, and where the next element starts."""
    tag, start, end = _element(der, at)
    text = der[start:end].decode("ascii")
    if tag == _UTC_TIME and re.fullmatch(r"\d{12}Z", text):
        year = int(text[:2])
        text = ("19" if year >= 50 else "20") + text
    elif not (tag == _GENERALIZED_TIME and re.fullmatch(r"\d{14}Z", text)):
        raise ValueError(f"time {text!r} (tag {tag:#x}) is not in RFC 5280's form")
    fields = (int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[8:10]), int(text[10:12]), int(text[12:14]))
    return float(calendar.timegm((*fields, 0, 0, 0))), end
