"""`minions worker`, `minions submit` and `minions runs ...`: durable runs from the command line
(see docs/runs.md). Every command takes `--database-url` (default: ``MINIONS_DATABASE_URL``,
else ``sqlite:///./.minions/minions.db``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from minions._text import jsonable, token_count
from minions.cli._errors import UsageError
from minions.cli._running import InputsOption, parse_inputs

__all__: list[str] = []

T = TypeVar("T")

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
RunArgument = Annotated[
    str, typer.Argument(metavar="RUN", help="The run's id.", show_default=False)
]

runs_app = typer.Typer(
    name="runs",
    help="List, show, follow, cancel, resume, approve, rerun and diff durable runs.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


def _out() -> Console:
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = max(console.width, 200)  # ids and times whole in pipes and logs
    return console


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def _store(url: str | None, *, create: bool = False) -> Any:
    from minions.runs import RunStore

    return RunStore(url, create=create)


def _when(moment: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment)) if moment else ""


def _duration(record: Any) -> str:
    if record.started_at is None:
        return ""
    end = record.finished_at or time.time()
    return f"{end - record.started_at:.2f}s"


def _tokens(usage: dict[str, int]) -> str:
    if not usage.get("calls"):
        return ""
    total = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return token_count(total, unreported=usage.get("unknown_calls", 0) > 0)


def _record_data(record: Any) -> dict[str, Any]:
    import dataclasses

    data: dict[str, Any] = jsonable(dataclasses.asdict(record))
    data.pop("cancel_requested", None)
    return data


# -- worker and submit --------------------------------------------------------------------------


def worker(
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Runs at a time in this worker.")
    ] = 4,
    executor_id: Annotated[
        str | None,
        typer.Option(
            "--executor-id",
            metavar="ID",
            help="This worker's id (default: host, process and a random suffix). Restarting "
            "with the same id recovers its runs at once.",
            show_default=False,
        ),
    ] = None,
    database_url: DatabaseOption = None,
    otel: Annotated[
        bool,
        typer.Option(
            "--otel",
            help="Export the runs' OpenTelemetry spans with OTLP (the standard "
            "OTEL_EXPORTER_OTLP_* variables; needs minions[otel] and an OTLP exporter).",
        ),
    ] = False,
) -> None:
    """Run queued runs until stopped (Ctrl-C or SIGTERM).

    Runs of a worker that died are recovered by another live worker, from their last
    completed step.
    """
    from minions._text import redact_url as describe
    from minions.runs import Worker
    from minions.runs import database_url as resolve

    url = resolve(database_url)
    err = Console(stderr=True, highlight=False, soft_wrap=True)

    def ready(worker: Worker) -> None:
        err.print(
            f"worker {worker.executor_id}: running queued runs of {describe(url)} "
            f"({worker.concurrency} at a time); Ctrl-C or SIGTERM stops it",
            markup=False,
        )
        for version, runs in sorted(worker.stranded.items()):
            err.print(
                f"warning: {len(runs)} queued or unfinished run(s) belong to {version}, a "
                f"newer minions: only a worker of that version runs them "
                f"(e.g. {', '.join(runs[:3])})",
                markup=False,
            )

    import os

    tracer_provider = None
    if otel:
        from minions.cli._otel import otlp_tracer_provider

        try:
            tracer_provider = otlp_tracer_provider()
        except UsageError as exc:
            err.print(f"error: {exc}", markup=False)
            raise typer.Exit(2) from None
    from minions._step.settings import RunSettings
    from minions._tracing.tracer import RunTracer

    settings = RunSettings(
        model=os.environ.get("MINIONS_MODEL"),
        tracer=None if tracer_provider is None else RunTracer(tracer_provider),
    )
    running = Worker(
        url, concurrency=concurrency, executor_id=executor_id, settings=settings, on_ready=ready
    )
    try:
        running.run()
    finally:
        if tracer_provider is not None:
            tracer_provider.shutdown()  # sends the spans still batched
    if running.state == "failed":
        err.print(f"error: {running.error}", markup=False)
        raise typer.Exit(1)
    err.print("worker stopped; its unfinished runs go on in the next worker", markup=False)


def submit(
    recipe: Annotated[
        Path, typer.Argument(metavar="RECIPE", help="The recipe file (YAML).", show_default=False)
    ],
    inputs: InputsOption = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            metavar="KEY",
            help="Submitting again with the same key returns the same run.",
            show_default=False,
        ),
    ] = None,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Queue a run of a recipe for the workers; print its id."""
    given = parse_inputs(inputs or ())
    if not recipe.is_file():
        raise UsageError(f"no such recipe file: {str(recipe)!r}")
    store = _store(database_url, create=True)
    try:
        run_id, _created = _run(store.submit(recipe, given, idempotency_key=idempotency_key))
    finally:
        store.close()
    typer.echo(json.dumps({"run_id": run_id}) if json_output else run_id)


# -- runs ---------------------------------------------------------------------------------------


@runs_app.command("list")
def list_runs(
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help="queued, running, waiting, completed, failed or cancelled.",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The runs, newest first."""
    from minions.runs import STATUSES

    if status is not None and status not in STATUSES:
        raise UsageError(f"unknown status {status!r}; one of: {', '.join(STATUSES)}")
    store = _store(database_url)
    try:
        records = _run(store.list_runs(status=status, limit=limit))
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps([_record_data(r) for r in records], indent=2))
        return
    if not records:
        Console(stderr=True).print("no runs" + (f" {status}" if status else ""), markup=False)
        return
    table = Table(show_edge=False, pad_edge=False)
    for name in ("run", "status", "recipe", "created", "time", "tokens", "error"):
        table.add_column(name, justify="right" if name in ("time", "tokens") else "left")
    for r in records:
        table.add_row(
            r.run_id,
            r.status,
            r.recipe_id,
            _when(r.created_at),
            _duration(r),
            _tokens(r.usage),
            (r.error or "")[:60],
        )
    _out().print(table)


@runs_app.command("show")
def show(
    run: RunArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """A run: its status, each finished step (visit, attempts, output, usage), its usage and
    error, and the calls it waits for."""
    store = _store(database_url)
    try:
        record = _run(store.get(run))
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps(_record_data(record), indent=2, ensure_ascii=False))
        return
    out = _out()
    out.print(
        f"run {record.run_id}: {record.status} ({record.recipe_id})"
        + (f", {_duration(record)}" if record.started_at else "")
        + (f", {_tokens(record.usage)} tokens" if _tokens(record.usage) else ""),
        markup=False,
    )
    out.print(
        f"created {_when(record.created_at)}"
        + (f" · worker {record.executor_id}" if record.executor_id else "")
        + (
            f" · rerun of {record.parent_run_id} from {record.from_step}"
            if record.parent_run_id
            else ""
        ),
        markup=False,
    )
    if record.steps:
        table = Table(show_edge=False, pad_edge=False)
        for name in ("step", "visit", "status", "attempts", "tokens", "output"):
            table.add_column(name)
        for s in record.steps:
            output = (
                s.output if isinstance(s.output, str) else json.dumps(s.output, ensure_ascii=False)
            )
            table.add_row(
                s.step_id, str(s.visit), s.status, str(s.attempts), _tokens(s.usage), output[:80]
            )
        out.print(table)
    for a in record.approvals:
        state = (
            "waiting"
            if a.decided_at is None
            else ("approved" if a.approved else f"rejected: {a.reason or ''}")
        )
        out.print(
            f"approval {a.call_id}: {a.tool}({json.dumps(a.arguments)}) {state}", markup=False
        )
    if record.output is not None:
        out.print(
            "output: "
            + (
                record.output
                if isinstance(record.output, str)
                else json.dumps(record.output, ensure_ascii=False)
            ),
            markup=False,
        )
    if record.error:
        out.print(f"error: {record.error}", markup=False, style="red")


@runs_app.command("events")
def events(
    run: RunArgument,
    after: Annotated[
        int,
        typer.Option(
            "--after", min=0, metavar="SEQ", help="Only events after this sequence number."
        ),
    ] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until the run ends.")
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    database_url: DatabaseOption = None,
) -> None:
    """A run's stored events, in order (JSON lines with --json)."""
    from minions.events import Event, event_to_json

    store = _store(database_url)

    def show(event: Event) -> None:
        if json_output:
            typer.echo(event_to_json(event))
            return
        detail = getattr(event, "error", None) or getattr(event, "name", None) or ""
        step = event.step_id or ""
        when = _when(event.timestamp)
        typer.echo(f"{event.seq:>5} {when} {event.kind:<22} {step} {detail}".rstrip())

    async def read() -> None:
        if follow:
            async for event in store.follow(run, after=after):
                show(event)
        else:
            for event in await store.events(run, after=after):
                show(event)

    try:
        _run(read())
    except KeyboardInterrupt:
        pass
    finally:
        store.close()


@runs_app.command("cancel")
def cancel(run: RunArgument, database_url: DatabaseOption = None) -> None:
    """Cancel a run: a queued one at once, a running one at its next step boundary."""
    store = _store(database_url)
    try:
        record = _run(store.cancel(run))
    finally:
        store.close()
    typer.echo(f"run {record.run_id}: {record.status}")


@runs_app.command("resume")
def resume(run: RunArgument, database_url: DatabaseOption = None) -> None:
    """Queue a failed or cancelled run again: it goes on from its last completed step."""
    store = _store(database_url)
    try:
        record = _run(store.resume(run))
    finally:
        store.close()
    typer.echo(f"run {record.run_id}: {record.status}")


@runs_app.command("approve")
def approve(
    run: RunArgument,
    call_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[CALL_ID]",
            help="The call (needed when it waits for several).",
            show_default=False,
        ),
    ] = None,
    reject: Annotated[
        str | None,
        typer.Option(
            "--reject",
            metavar="REASON",
            help="Reject the call; the reason goes to the model.",
            show_default=False,
        ),
    ] = None,
    database_url: DatabaseOption = None,
) -> None:
    """Approve (or with --reject, reject) a call the run waits for."""
    store = _store(database_url)
    try:
        record = _run(store.approve(run, call_id, approved=reject is None, reason=reject))
    finally:
        store.close()
    typer.echo(f"run {record.run_id}: {'rejected' if reject is not None else 'approved'}")
