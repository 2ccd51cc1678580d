"""Structured logs: one line per event, `key=value` pairs that name the claim, pod and
device concerned, so a platform engineer can grep a node's log for one claim UID."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any


def _fmt_value(v: Any) -> str:
    s = str(v)
    if s == "" or any(c in s for c in ' ="\n\t'):
        return json.dumps(s)
    return s


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ts += f".{int(record.msecs):03d}Z"
        parts = [
            f"ts={ts}",
            f"level={record.levelname.lower()}",
            f"component={record.name}",
            f"msg={_fmt_value(record.getMessage())}",
        ]
        fields = getattr(record, "fields", None) or {}
        parts += [f"{k}={_fmt_value(v)}" for k, v in fields.items() if v is not None]
        if record.exc_info:
            parts.append(f"exc={_fmt_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "component": record.name,
            "msg": record.getMessage(),
        }
        out.update(
            {k: v for k, v in (getattr(record, "fields", None) or {}).items() if v is not None}
        )
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class Logger:
    """`log.info("claim prepared", claim="ns/name", uid=..., device="gpu-9b3c2810")`."""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(name)

    def _emit(self, level: int, msg: str, exc: bool, *, fields: dict[str, Any]) -> None:
        if self._log.isEnabledFor(level):
            self._log.log(level, msg, extra={"fields": fields}, exc_info=exc)

    def debug(self, msg: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, msg, False, fields=fields)

    def info(self, msg: str, **fields: Any) -> None:
        self._emit(logging.INFO, msg, False, fields=fields)

    def warning(self, msg: str, **fields: Any) -> None:
        self._emit(logging.WARNING, msg, False, fields=fields)

    def error(self, msg: str, exc: bool = False, **fields: Any) -> None:
        self._emit(logging.ERROR, msg, exc, fields=fields)


def get_logger(name: str) -> Logger:
    return Logger(name)


def setup(level: str = "info", fmt: str | None = None) -> None:
    """Configures the root logger once; DRADRIVER_LOG_FORMAT=json switches to JSON lines."""
    fmt = fmt or os.environ.get("DRADRIVER_LOG_FORMAT", "text")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The official client logs every request at DEBUG; keep our own debug readable.
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
