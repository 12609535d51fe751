"""How the command line's services write their lines: as text for a person (the default), or
as JSON, one object a line, for journald and log shippers (`--log-format json`).

`configure` is the one place that sets it up (the command line calls it once). Two streams:
- log records (`logging`): text `TIME LEVEL LOGGER: message` on stderr, as always;
- a service's status lines (started, its periodic summary, stopped) through `status_line`:
  the bare line on stdout in text, as the services printed them before.
In JSON both become objects with `time` (RFC 3339, UTC, ns), `ts_ns` (ns since the epoch),
`level`, `logger`, `service` (the command), `message`, and the record's structured fields
(`extra=`: `link`, `buffer_bytes`, ...) as keys of their own.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

TEXT, JSON = "text", "json"
LOG_FORMATS = (TEXT, JSON)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STATUS_LOGGER = "p4bs.status"

# What every LogRecord has; anything else on a record came in through `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "ts_ns"}


def add_log_format_option(parser: argparse.ArgumentParser) -> None:
    """`--log-format text|json` on a long-running service's command."""
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=TEXT,
        help="text (default) or json: one JSON object a line, for journald and log shippers",
    )


def rfc3339_ns(ts_ns: int) -> str:
    """`2026-11-29T03:40:00.123456789Z`: UTC, nanosecond digits."""
    seconds, ns = divmod(ts_ns, 10**9)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{ns:09d}Z"


class JsonFormatter(logging.Formatter):
    """A record as one JSON object (the fields above); values JSON cannot hold as text."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        ts_ns = getattr(record, "ts_ns", None) or int(record.created * 10**9)
        line: dict[str, Any] = {
            "time": rfc3339_ns(ts_ns),
            "ts_ns": ts_ns,
            "level": record.levelname.lower(),
            "logger": record.name,
            "service": self.service,
            "message": record.getMessage(),
        }
        line |= {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class _CurrentStdout(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stdout is when a line is written (a test's capture too)."""

    @property
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


def _stamp_ns(record: logging.LogRecord) -> bool:
    """A handler's filter: the record's time in ns (a LogRecord has only a float of seconds
    before Python 3.13)."""
    record.ts_ns = time.time_ns()
    return True


def _status_to_stdout(formatter: logging.Formatter) -> None:
    status = logging.getLogger(STATUS_LOGGER)
    for handler in list(status.handlers):
        status.removeHandler(handler)
    out = _CurrentStdout()
    out.addFilter(_stamp_ns)
    out.setFormatter(formatter)
    status.addHandler(out)
    status.setLevel(logging.INFO)
    status.propagate = False


def configure(log_format: str = TEXT, *, verbose: bool = False, service: str = "p4bs") -> None:
    """Log records and status lines in `log_format` from now on (debug records with
    `verbose`), naming `service` in JSON. Called again, it replaces what it set before."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: one of {', '.join(LOG_FORMATS)}")
    json_lines = log_format == JSON
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    errors = logging.StreamHandler(sys.stderr)
    errors.addFilter(_stamp_ns)
    errors.setFormatter(JsonFormatter(service) if json_lines else logging.Formatter(TEXT_FORMAT))
    root.addHandler(errors)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    _status_to_stdout(JsonFormatter(service) if json_lines else logging.Formatter("%(message)s"))


def status_line(message: str, **fields: Any) -> None:
    """A service's status line: `message` as it is on stdout in text; in JSON an object with
    `fields` as keys beside the message."""
    logging.getLogger(STATUS_LOGGER).info(message, extra=fields)


# Before (or without) `configure`, status lines are printed as they are.
_status_to_stdout(logging.Formatter("%(message)s"))
