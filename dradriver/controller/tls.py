"""The webhook's serving certificate: made at startup from a CA that exists only in this
process, or loaded from files someone else keeps current (cert-manager), reloaded when
they change. Either way `context` is the SSLContext for the next connection; it is
replaced whole, never modified, so a handshake never sees a new certificate with an old
key.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import ssl
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Clock = Callable[[], dt.datetime]
# Tolerates API servers whose clock runs a little behind ours.
BACKDATE = dt.timedelta(minutes=5)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def serving_names(service: str, namespace: str) -> list[str]:
    # The API server connects to a service-based webhook as <service>.<namespace>.svc.
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes
    not_before: dt.datetime
    not_after: dt.datetime


class CertificateAuthority:
    """A CA whose key is never written anywhere: a pod's restart makes a new one."""

    def __init__(self, now: dt.datetime, valid: dt.timedelta) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dradriver webhook CA")])
        public = self._key.public_key()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + valid)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self, dns_names: Sequence[str], ips: Sequence[str], now: dt.datetime, *, valid: dt.timedelta
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        not_before = now - BACKDATE
        not_after = min(now + valid, self.cert.not_valid_after_utc)
        ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        cert = (
            x509.CertificateBuilder()
            # Clients match SANs only; a CN holds at most 64 characters, a service name
            # in a long namespace more.
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dradriver webhook")]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM), key_pem, not_before, not_after)


def _usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


class ServingTLS(Protocol):
    context: ssl.SSLContext
    ca_pem: bytes | None  # the CA to put into the webhook configuration; None: not ours

    def describe(self) -> str: ...

    def refresh(self) -> bool: ...

    def close(self) -> None: ...


class SelfSignedTLS:
    """A CA and a serving certificate made here. The serving certificate is reissued from
    the same CA once two thirds of its life have passed, so the caBundle stays valid."""

    def __init__(
        self,
        dns_names: Sequence[str],
        ips: Sequence[str] = ("127.0.0.1",),
        *,
        ca_valid: dt.timedelta = dt.timedelta(days=3650),
        cert_valid: dt.timedelta = dt.timedelta(days=365),
        clock: Clock = utcnow,
    ) -> None:
        self.dns_names, self.ips = list(dns_names), list(ips)
        self.cert_valid, self.clock = cert_valid, clock
        self.ca = CertificateAuthority(clock(), ca_valid)
        self.ca_pem: bytes | None = self.ca.pem
        self._issue()

    def _issue(self) -> None:
        self.issued = self.ca.issue(self.dns_names, self.ips, self.clock(), valid=self.cert_valid)
        self.context = _context_from_pem(self.issued.cert_pem + self.ca.pem, self.issued.key_pem)

    def describe(self) -> str:
        return f"self-signed CA; serving certificate for {', '.join(self.dns_names + self.ips)}"

    def refresh(self) -> bool:
        life = self.issued.not_after - self.issued.not_before
        if self.clock() < self.issued.not_before + life * 2 / 3:
            return False
        self._issue()
        return True

    def close(self) -> None:
        """Nothing to remove: the key is on disk only while it is loaded."""


def _context_from_pem(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """ssl loads a key only from a file: it is written to a directory only this user can
    read and removed as soon as it is loaded, so a process killed with SIGKILL (which runs
    no cleanup) leaves no private key behind in /tmp."""
    tmp = Path(tempfile.mkdtemp(prefix="dradriver-webhook-"))
    try:
        cert, key = tmp / "tls.crt", tmp / "tls.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key_pem)
        cert.write_bytes(cert_pem)
        return server_context(cert, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class FileTLS:
    """A certificate and key from files, reloaded when either file changes (a Secret
    volume swaps a symlink, so the inode changes)."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.ca_pem: bytes | None = None
        self._seen = self._stat()
        self.context = server_context(cert_file, key_file)

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for f in (self.cert_file, self.key_file):
            try:
                st = f.stat()
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((0, 0, 0))
        return tuple(out)

    def describe(self) -> str:
        return f"certificate {self.cert_file}, key {self.key_file}"

    def refresh(self) -> bool:
        """Reloads changed files; raises (keeping the old context) when they do not load,
        for example while only one of the two has been replaced yet."""
        seen = self._stat()
        if seen == self._seen:
            return False
        self.context = server_context(self.cert_file, self.key_file)
        self._seen = seen
        return True

    def close(self) -> None:
        pass
