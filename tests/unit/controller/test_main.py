"""`dradriver controller` flags: defaults, DRADRIVER_* environment, and refusals at start."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.cli import build_parser, main


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    args = build_parser().parse_args(["controller"])
    assert (args.driver_name, args.webhook_address, args.webhook_port) == (
        "gpu.dradriver.io",
        "0.0.0.0",
        8443,
    )
    assert (args.webhook_config_name, args.namespace, args.service_name) == (
        "dradriver-admission",
        "dradriver",
        "dradriver-controller",
    )
    assert (args.failure_policy, args.healthz_port, args.tls_cert_file) == ("Fail", 8080, None)


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "gpu-system")
    monkeypatch.setenv("DRADRIVER_WEBHOOK_PORT", "9443")
    monkeypatch.setenv("DRADRIVER_FAILURE_POLICY", "Ignore")
    monkeypatch.setenv("DRADRIVER_DRIVER_NAME", "gpu.example.com")
    args = build_parser().parse_args(["controller"])
    assert (args.namespace, args.webhook_port, args.failure_policy, args.driver_name) == (
        "gpu-system",
        9443,
        "Ignore",
        "gpu.example.com",
    )
    monkeypatch.setenv("DRADRIVER_NAMESPACE", "explicit")
    assert build_parser().parse_args(["controller"]).namespace == "explicit"


def test_bad_failure_policy_is_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["controller", "--failure-policy", "Maybe"])


@pytest.fixture
def root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def test_tls_files_go_together_and_must_load(tmp_path: Path, root_logger: None) -> None:
    sigint = signal.getsignal(signal.SIGINT)
    assert main(["controller", "--tls-cert-file", str(tmp_path / "c")]) == 2
    missing = ["--tls-cert-file", str(tmp_path / "c"), "--tls-key-file", str(tmp_path / "k")]
    assert main(["controller", *missing]) == 2
    assert signal.getsignal(signal.SIGINT) is sigint  # refused before taking over signals
