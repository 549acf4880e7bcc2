"""The log of a server process (`minions._logsetup`): one stream, one format for minions' and
the libraries' records (JSON: one object per line, a traceback a field), secrets redacted in
either format, a store outage said once when it goes and once when it is back; and a bad
``--log-format`` is a usage error."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog
from typer.testing import CliRunner

from minions import _logsetup
from minions.cli._app import app

SECRET = "sk-secret-value-0123456789"


@pytest.fixture
def stderr() -> Iterator[io.StringIO]:
    """What the process writes (its stderr); the logging set up by the test undone after."""
    stream = io.StringIO()
    root, dbos = logging.getLogger(), logging.getLogger("dbos")
    saved = (root.handlers[:], root.level, dbos.handlers[:], dbos.propagate)
    factory = logging.getLogRecordFactory()
    try:
        yield stream
    finally:
        root.handlers, root.level = saved[0], saved[1]
        dbos.handlers, dbos.propagate = saved[2], saved[3]
        logging.setLogRecordFactory(factory)
        structlog.reset_defaults()


def install(format: _logsetup.LogFormat, stream: io.StringIO) -> None:
    _logsetup.install(_logsetup.Redactor([SECRET]), format=format, stream=stream)


def test_json_logs_are_one_object_per_line_whoever_writes_them(stderr: io.StringIO) -> None:
    install("json", stderr)
    structlog.get_logger("minions.runs").warning("run taken over", run_id="r1", key=SECRET)
    try:
        raise ValueError(f"bad {SECRET}\nsecond line")
    except ValueError:
        logging.getLogger("dbos").exception("workflow failed")
        structlog.get_logger("minions.x").exception("handled")
    logging.getLogger("sqlalchemy.pool").warning("with %s args", "formatted")
    lines = stderr.getvalue().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records] == [
        "run taken over",
        "workflow failed",
        "handled",
        "with formatted args",
    ]
    assert [r["logger"] for r in records] == [
        "minions.runs",
        "dbos",
        "minions.x",
        "sqlalchemy.pool",
    ]
    assert all(r["level"] in ("warning", "error") and "timestamp" in r for r in records)
    assert "ValueError" in records[1]["exception"]
    assert "ValueError" in records[2]["exception"]
    assert SECRET not in stderr.getvalue()
    assert "[redacted]" in records[0]["key"]


def test_console_logs_are_redacted_too(stderr: io.StringIO) -> None:
    install("console", stderr)
    structlog.get_logger("minions").warning("calling", key=SECRET)
    logging.getLogger("some.library").warning("with key %s", SECRET)
    text = stderr.getvalue()
    assert "calling" in text
    assert "with key [redacted]" in text
    assert SECRET not in text


def test_a_store_outage_is_said_once_when_it_goes_and_once_when_it_is_back(
    stderr: io.StringIO,
) -> None:
    install("json", stderr)
    minions, dbos = structlog.get_logger("minions.runs._async"), logging.getLogger("dbos")
    minions.warning("run store unavailable; trying again until it is back", error="refused")
    for _ in range(13):
        try:
            raise OSError("connection refused\nmulti-line detail")
        except OSError:
            dbos.exception("Exception encountered in queue thread: OperationalError")
    structlog.get_logger("minions.runs._worker").warning(
        "run store unavailable; the worker waits for it"
    )
    minions.warning("run store back", after=1.2)
    structlog.get_logger("minions.runs._worker").warning("run store back; the worker goes on")
    logging.getLogger("dbos").warning("something else")  # not about the store: said
    records = [json.loads(line) for line in stderr.getvalue().splitlines()]
    assert [r["event"] for r in records] == [
        "run store unavailable; trying again until it is back",
        "run store back",
        "something else",
    ]
    assert records[1]["held_back"] == 14
    # A library's record is the first to tell: said in one line, its traceback left out.
    stderr.truncate(0)
    stderr.seek(0)
    try:
        raise OSError("server closed the connection unexpectedly")
    except OSError:
        dbos.exception("Exception encountered in queue thread")
    [record] = [json.loads(line) for line in stderr.getvalue().splitlines()]
    assert record["event"].startswith("run store unavailable: ")
    assert "exception" not in record


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_bad_log_format_is_a_usage_error(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--log-format", "xml"])
    assert result.exit_code == 2
    assert "'xml' is not a log format (use console or json)" in result.output


def test_the_environment_chooses_the_format_when_no_option_does() -> None:
    assert _logsetup.log_format(None, {"MINIONS_LOG_FORMAT": "JSON"}) == "json"
    assert _logsetup.log_format("console", {"MINIONS_LOG_FORMAT": "json"}) == "console"
    assert _logsetup.log_format(None, {}) == "console"
    with pytest.raises(ValueError, match="MINIONS_LOG_FORMAT"):
        _logsetup.log_format(None, {"MINIONS_LOG_FORMAT": "yaml"})
