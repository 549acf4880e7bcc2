"""What the commands of `minions` share: the options of the commands over a run store
(``--database-url``, ``--json``, ``--retention``, a run's id), the recipe inputs option, the
long-running commands' (`serve`, `worker`) ``--log-format`` and how their log is set up, and
how they print (a console that keeps ids whole in pipes, local times, a run's duration and
tokens, a record as JSON, a long text said once, a table cell never read as markup, an
operator's line in the log's format)."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from minions import _logsetup
from minions._text import jsonable, token_count
from minions.cli._errors import UsageError
from minions.models import MODEL_ENV

if TYPE_CHECKING:
    from minions.runs import Actor, RunStore

__all__: list[str] = []

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        metavar="URL",
        help="The run store: sqlite:///PATH or postgresql://... (default: "
        "$MINIONS_DATABASE_URL, else sqlite:///./.minions/minions.db).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def project_name(value: str | None) -> str | None:
    """`value`, when it names a project (a bad one is a usage error: exit 2)."""
    if value is None:
        return None
    from minions.runs import Scope

    try:
        return Scope().project_for(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


ProjectOption = Annotated[
    str | None,
    typer.Option(
        "--project",
        metavar="PROJECT",
        help="The project (default: default): keys of other projects never see it.",
        callback=project_name,
        show_default=False,
    ),
]
RetentionOption = Annotated[
    str | None,
    typer.Option(
        "--retention",
        metavar="AGE|N runs",
        help="Prune finished runs now and then: keep those younger than AGE (30d, 12h) or the "
        "newest N ('1000 runs'). Default: keep every run.",
        show_default=False,
    ),
]
AuditRetentionOption = Annotated[
    str,
    typer.Option(
        "--audit-retention",
        metavar="AGE|never",
        help="Prune the audit log's entries older than AGE now and then (365d, 90d); "
        "'never' keeps them all.",
    ),
]
AUDIT_RETENTION = "365d"
"""The audit log's horizon by default (`minions.runs.Worker`'s)."""
ConcurrencyOption = Annotated[
    int, typer.Option("--concurrency", min=1, metavar="N", help="Runs at a time in the worker.")
]
GraceOption = Annotated[
    float,
    typer.Option(
        "--grace",
        min=0,
        metavar="SECONDS",
        envvar="MINIONS_WORKER_GRACE",
        help="When stopped (SIGTERM, Ctrl-C), let the worker's steps in flight finish for this "
        "long, then hand their runs back to the queue (they go on in another worker from "
        "their checkpoints, in their place). A second signal stops at once. "
        "(env: MINIONS_WORKER_GRACE)",
    ),
]
GRACE = 30.0
"""Seconds a stopping worker's steps in flight get by default (`minions.runs.Worker`'s)."""


def audit_retention_of(text: str) -> str | None:
    """The ``--audit-retention`` a worker takes (None: ``never``, keep every entry).

    Raises:
        UsageError: it is neither a duration nor ``never``.
    """
    from minions._duration import duration_seconds

    if text.strip().lower() == "never":
        return None
    try:
        duration_seconds(text)
    except ValueError as exc:
        raise UsageError(f"--audit-retention: {exc}; or 'never'") from None
    return text


RecipesRootOption = Annotated[
    Path | None,
    typer.Option(
        "--recipes",
        metavar="DIR",
        envvar="MINIONS_RECIPES",
        help="The recipes root: each run's recipe file is found here by the recipe's id "
        "(searched recursively), wherever it was on the host that submitted it "
        "(default: $MINIONS_RECIPES, else the path it was submitted from).",
        show_default=False,
    ),
]
ProjectRecipesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--project-recipes",
        metavar="PROJECT=DIR",
        help="A project's own recipes folder (repeat for more): its runs' recipes are "
        "found there, not in --recipes, which serves every other project.",
        show_default=False,
    ),
]


def project_folders(given: Sequence[str] | None) -> dict[str, Path]:
    """``--project-recipes PROJECT=DIR`` options as folders by project.

    Raises:
        UsageError: one is not ``PROJECT=DIR`` with a project's name and a folder, or a
            project is given twice.
    """
    from minions.runs import Scope

    found: dict[str, Path] = {}
    for text in given or ():
        project, sep, folder = text.partition("=")
        if not sep or not folder:
            raise UsageError(f"--project-recipes {text!r}: write PROJECT=DIR")
        try:
            Scope().project_for(project)
        except ValueError as exc:
            raise UsageError(f"--project-recipes: {exc}") from None
        if project in found:
            raise UsageError(f"--project-recipes: project {project!r} is given twice")
        if not Path(folder).is_dir():
            raise UsageError(f"--project-recipes: no such folder: {folder!r}")
        found[project] = Path(folder)
    return found


RunArgument = Annotated[
    str, typer.Argument(metavar="RUN", help="The run's id.", show_default=False)
]
SinceOption = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="AGE|TIME",
        help="Only those created in the last AGE (30m, 12h, 7d) or since TIME (local time: "
        "2026-11-28 or 2026-11-28T06:00).",
        show_default=False,
    ),
]
InputsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--input",
        "-i",
        metavar="NAME=VALUE",
        help="An input of the recipe (repeat for more); converted to its declared type.",
        show_default=False,
    ),
]

LogFormatOption = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        metavar="json|console",
        help="How the process logs, on stderr: console (lines for people) or json (one object "
        "per line; a traceback is a field). Default: $MINIONS_LOG_FORMAT, else console.",
        show_default=False,
    ),
]


def check_recipes_root(recipes: Path | None) -> None:
    """Refuse a recipes root that is not a folder.

    Raises:
        UsageError: it is not.
    """
    if recipes is not None and not recipes.is_dir():
        raise UsageError(
            f"--recipes: no such folder: {str(recipes)!r} (--recipes or MINIONS_RECIPES)"
        )


def parse_inputs(pairs: Sequence[str]) -> dict[str, str]:
    """``-i name=value`` options as a mapping; values stay text (the recipe's declared input
    types convert them when the run starts).

    Raises:
        UsageError: an option is not ``name=value``, or a name is given twice.
    """
    inputs: dict[str, str] = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        name = name.strip()
        if not equals or not name:
            raise UsageError(f"bad input {pair!r}: write -i NAME=VALUE, e.g. -i hours=48")
        if name in inputs:
            raise UsageError(f"input {name!r} is given twice")
        inputs[name] = value
    return inputs


def since_time(since: str | None, *, now: float | None = None) -> float | None:
    """The moment ``--since`` names (Unix seconds; ``None``: none given): an age before now
    (``30m``, ``12h``, ``7d``, ``1h30m``), or a date or date and time in local time.

    Raises:
        UsageError: it is neither.
    """
    if since is None:
        return None
    from datetime import datetime

    from minions._duration import duration_seconds

    text = since.strip()
    try:
        return (time.time() if now is None else now) - duration_seconds(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise UsageError(
            f"--since {since!r}: give an age (30m, 12h, 7d) or a local date and time "
            "(2026-11-28 or 2026-11-28T06:00)"
        ) from None


def shortened(text: str, limit: int | None) -> str:
    """`text`, cut to `limit` characters with an ellipsis (``None``: whole)."""
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def one_of(names: Sequence[str]) -> str:
    """``a, b or c``."""
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else "".join(names)


def stdout() -> Console:
    """The console of a command's output: ids and times whole in pipes and logs."""
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = max(console.width, 200)
    return console


def cli_actor() -> str:
    """The actor the run store records for a command run here: ``cli:`` and the OS user
    (``cli`` alone when the user has no name)."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return "cli"
    return f"cli:{user}" if user else "cli"


def cli_who() -> Actor:
    """Who the run store's audit log records for a command run here: `cli_actor`, from this
    machine (its host name)."""
    import socket

    from minions.runs import Actor

    return Actor(name=cli_actor(), address=socket.gethostname() or None)


def plain(text: str) -> Text:
    """A table cell shown as it is: an error's ``[...]`` or an address is text, never Rich
    markup (which would drop it, or fail on ``[/x]``)."""
    return Text(text)


def ask_on_terminal(question: str) -> str:
    """A question on stderr (stdout holds a command's output), the answer from stdin."""
    sys.stderr.write(question)
    sys.stderr.flush()
    return sys.stdin.readline()


def asker(given: Callable[[str], str] | None) -> Callable[[str], str] | None:
    """Who answers a question: `given` (a test's, an embedding program's), else the person
    at the terminal when stdin and stderr are one, else nobody (``None``: a script, a pipe;
    the command then never waits for an answer)."""
    if given is None and sys.stdin.isatty() and sys.stderr.isatty():
        return ask_on_terminal
    return given


def open_store(url: str | None, *, create: bool = False) -> RunStore:
    """The run store at `url` (None: ``MINIONS_DATABASE_URL``, else the default)."""
    from minions.runs import RunStore

    return RunStore(url, create=create)


def local_time(moment: float | None) -> str:
    """``2026-11-28 06:02:31`` in local time (``""`` for none)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment)) if moment else ""


def run_time(record: Any) -> str:
    """How long a run (or a step) took, or has been running: ``1.25s``."""
    if record.started_at is None:
        return ""
    end = record.finished_at or time.time()
    return f"{end - record.started_at:.2f}s"


def token_text(usage: dict[str, int]) -> str:
    """A stored usage's tokens (``""`` when it called no model)."""
    if not usage.get("calls"):
        return ""
    total = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return token_count(total, unreported=usage.get("unknown_calls", 0) > 0)


def record_data(record: Any) -> dict[str, Any]:
    """A record of the store as JSON-ready data (what ``--json`` prints)."""
    data: dict[str, Any] = jsonable(dataclasses.asdict(record))
    data.pop("cancel_requested", None)
    outcome = getattr(record, "outcome", None)
    if outcome is not None:  # a run: how it stands for a person, beside its status
        data = {
            **{k: v for k, v in data.items() if k != "rejected_by"},
            "outcome": outcome,
            "rejected_by": data.get("rejected_by"),
        }
    return data


def model_note(model: str | None) -> str:
    """What a worker's startup line says of its model."""
    if model is None:
        return (
            f"; no model set ({MODEL_ENV}): a recipe with a recording beside it replays it, "
            "others fail"
        )
    from minions._text import redact_url

    return f"; model {redact_url(model)}"


def once(text: str, said: list[str]) -> str:
    """`text`, with the long texts `said` already (a step's error, then the same error in the
    run's) replaced by "(as above)"; `text` joins them."""
    shown = text
    for before in said:
        if before in shown:
            shown = shown.replace(before, "(as above)")
    if len(text) >= 40 and text not in said:
        said.append(text)
    return shown


def chosen_log_format(given: str | None) -> _logsetup.LogFormat:
    """The format of `--log-format` (or the environment's).

    Raises:
        UsageError: not a format.
    """
    try:
        return _logsetup.log_format(given, os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def set_up_logging(
    format: _logsetup.LogFormat,
    *,
    database_url: str | None,
    token: str | None = None,
    minions_info: bool = False,
) -> None:
    """The log of a server process: stderr, `format`, the token, the environment's secrets
    and the database's password redacted; warnings and errors, and minions' own info lines
    too when `minions_info` (a worker's: runs taken over, handed back, pruned, schedules
    fired)."""
    redact = _logsetup.Redactor(_logsetup.secrets_of(token, os.environ, database_url))
    _logsetup.install(redact, format=format)
    if minions_info:
        logging.getLogger("minions").setLevel(logging.INFO)


def say(err: Any, format: _logsetup.LogFormat, text: str, **fields: Any) -> None:
    """A line for the operator on stderr: printed as it is for people, or as a JSON log
    record (info, logger ``minions.cli``), so that a JSON log stays JSON line by line."""
    if format == "console":
        err.print(text, markup=False)
        return
    import structlog

    logging.getLogger("minions.cli").setLevel(logging.INFO)
    structlog.get_logger("minions.cli").info(text, **fields)
