"""The self-made CA and serving certificate, and certificates loaded from files."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from dradriver.controller import tls

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_serving_names() -> None:
    assert tls.serving_names("ctl", "drv") == ["ctl.drv.svc", "ctl.drv.svc.cluster.local"]


def test_self_signed_certificate_is_for_the_service_and_loopback() -> None:
    s = tls.SelfSignedTLS(tls.serving_names("ctl", "drv"), clock=lambda: NOW)
    try:
        ca = x509.load_pem_x509_certificate(s.ca_pem or b"")
        leaf = x509.load_pem_x509_certificate(s.issued.cert_pem)
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [
            "ctl.drv.svc",
            "ctl.drv.svc.cluster.local",
        ]
        assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
        leaf.verify_directly_issued_by(ca)
        assert leaf.not_valid_before_utc == NOW - tls.BACKDATE
    finally:
        s.close()


def test_the_key_is_on_disk_only_while_it_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller killed with SIGKILL runs no cleanup: nothing it wrote may outlive the
    load (the e2e restart test kills it so, and each run used to leave a key in /tmp)."""
    seen: list[tuple[Path, int, int]] = []
    load = tls.server_context

    def spy(cert: Path, key: Path) -> ssl.SSLContext:
        seen.append(
            (key, stat.S_IMODE(key.parent.stat().st_mode), stat.S_IMODE(key.stat().st_mode))
        )
        return load(cert, key)

    monkeypatch.setattr(tls, "server_context", spy)
    now = [NOW]
    s = tls.SelfSignedTLS(["a.b.svc"], cert_valid=dt.timedelta(days=30), clock=lambda: now[0])
    now[0] = NOW + dt.timedelta(days=21)
    assert s.refresh()  # never closed, as after a SIGKILL
    assert len(seen) == 2
    for key, dir_mode, key_mode in seen:
        assert (dir_mode, key_mode) == (0o700, 0o600)
        assert not key.parent.exists()


def test_long_namespaces_fit() -> None:
    names = tls.serving_names("dradriver-controller", "n" * 63)
    s = tls.SelfSignedTLS(names)
    s.close()
    leaf = x509.load_pem_x509_certificate(s.issued.cert_pem)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == names


def test_serving_certificate_is_reissued_from_the_same_ca() -> None:
    now = [NOW]
    s = tls.SelfSignedTLS(["a.b.svc"], cert_valid=dt.timedelta(days=30), clock=lambda: now[0])
    try:
        first, ctx, ca = s.issued, s.context, s.ca_pem
        now[0] = NOW + dt.timedelta(days=19)
        assert not s.refresh() and s.context is ctx
        now[0] = NOW + dt.timedelta(days=21)
        assert s.refresh()
        assert s.context is not ctx and s.ca_pem == ca and s.issued != first
        leaf = x509.load_pem_x509_certificate(s.issued.cert_pem)
        leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(ca or b""))
    finally:
        s.close()


def test_files_are_reloaded_when_replaced(tmp_path: Path) -> None:
    a = tls.SelfSignedTLS(["a.b.svc"])
    b = tls.SelfSignedTLS(["a.b.svc"])
    for name, s in (("a", a), ("b", b)):
        (tmp_path / f"{name}.crt").write_bytes(s.issued.cert_pem + (s.ca_pem or b""))
        (tmp_path / f"{name}.key").write_bytes(s.issued.key_pem)
    try:
        cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
        shutil.copy(tmp_path / "a.crt", cert)
        shutil.copy(tmp_path / "a.key", key)
        f = tls.FileTLS(cert, key)
        assert f.ca_pem is None and not f.refresh()
        ctx = f.context
        # Half a rotation (a new certificate, the old key) keeps the old context.
        new_cert = tmp_path / "new.crt"
        shutil.copy(tmp_path / "b.crt", new_cert)
        os.replace(new_cert, cert)
        with pytest.raises(OSError):
            f.refresh()
        assert f.context is ctx
        new_key = tmp_path / "new.key"
        shutil.copy(tmp_path / "b.key", new_key)
        os.replace(new_key, key)
        assert f.refresh() and f.context is not ctx
    finally:
        a.close()
        b.close()


def test_missing_files_fail_at_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        tls.FileTLS(tmp_path / "no.crt", tmp_path / "no.key")
