"""`minions worker`, `minions submit` and `minions runs list|show|events|cancel|resume|approve`:
durable runs from the command line (see docs/runs.md; `runs prune` is in `_prune`, `runs rerun`
and `runs diff` in `_rerun`). Every command takes `--database-url` (default:
``MINIONS_DATABASE_URL``, else ``sqlite:///./.minions/minions.db``)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from minions._duration import spoken
from minions._fold import RUN_STATUSES
from minions.cli._common import (
    AUDIT_RETENTION,
    GRACE,
    AuditRetentionOption,
    ConcurrencyOption,
    DatabaseOption,
    GraceOption,
    InputsOption,
    JsonOption,
    LogFormatOption,
    ProjectOption,
    ProjectRecipesOption,
    RecipesRootOption,
    RetentionOption,
    RunArgument,
    SinceOption,
    audit_retention_of,
    check_recipes_root,
    chosen_log_format,
    cli_who,
    local_time,
    model_note,
    once,
    one_of,
    open_store,
    parse_inputs,
    plain,
    project_folders,
    record_data,
    run_time,
    say,
    set_up_logging,
    shortened,
    since_time,
    stdout,
    token_text,
)
from minions.cli._errors import UsageError
from minions.cli._limits import LimitsOption, load_limits
from minions.cli._notify import NotifyOption, StuckAfterOption, notifier
from minions.models import MODEL_ENV

if TYPE_CHECKING:
    from minions.runs import RunRecord

__all__: list[str] = []


def _moved(event: Any) -> str:
    """What `runs events` says of a run's move between workers."""
    from minions.events import RunDraining, RunHandedBack, RunTakenOver

    if isinstance(event, RunDraining):
        flight = ", ".join(event.in_flight) or "no step"
        return f"worker {event.executor_id} stops: {flight} in flight, {event.grace:g}s grace"
    if isinstance(event, RunHandedBack):
        cut = f"; cut short: {', '.join(event.cut_short)}" if event.cut_short else ""
        return f"{event.reason}: by {event.executor_id}, queued as attempt {event.attempt}{cut}"
    if isinstance(event, RunTakenOver):
        holder = event.executor_id or "?"
        return f"from {holder} by {event.by}, queued as attempt {event.attempt}"
    return ""


# -- worker and submit --------------------------------------------------------------------------


def worker(
    concurrency: ConcurrencyOption = 4,
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
    retention: RetentionOption = None,
    audit_retention: AuditRetentionOption = AUDIT_RETENTION,
    limits: LimitsOption = None,
    recipes: RecipesRootOption = None,
    project_recipes: ProjectRecipesOption = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            metavar="PORT",
            help="Serve this process's Prometheus metrics at http://HOST:PORT/metrics "
            "(needs minions[metrics]).",
            show_default=False,
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            metavar="HOST",
            help="The address --metrics-port binds (0.0.0.0: every interface).",
        ),
    ] = "127.0.0.1",
    health_port: Annotated[
        int | None,
        typer.Option(
            "--health-port",
            min=0,
            max=65535,
            metavar="PORT",
            help="Serve probes at http://HOST:PORT/health/live (the process answers) and "
            "/health/ready (the store answers and the worker takes runs; 503 with the reason "
            "otherwise). May be the metrics port.",
            show_default=False,
        ),
    ] = None,
    health_host: Annotated[
        str,
        typer.Option(
            "--health-host",
            metavar="HOST",
            help="The address --health-port binds (0.0.0.0: every interface).",
        ),
    ] = "127.0.0.1",
    log_format: LogFormatOption = None,
    grace: GraceOption = GRACE,
    notify: NotifyOption = None,
    notify_stuck_after: StuckAfterOption = "15m",
) -> None:
    """Run queued runs until stopped (Ctrl-C or SIGTERM), and fire the store's schedules.

    Stopping drains: nothing more is claimed, steps in flight finish within --grace, and
    unfinished runs are handed back to the queue. Runs of a worker that died are recovered
    by another live worker, from their last completed step.
    """
    from minions._text import redact_url as describe
    from minions.runs import Worker
    from minions.runs import database_url as resolve

    url = resolve(database_url)
    given_limits = load_limits(limits)
    check_recipes_root(recipes)
    own_recipes = project_folders(project_recipes)
    chosen_format = chosen_log_format(log_format)
    exported = None
    if metrics_port is not None:
        from minions._tracing.prometheus import PrometheusMetrics
        from minions.errors import MissingExtraError

        try:
            exported = PrometheusMetrics()
        except MissingExtraError as exc:
            raise UsageError(f"--metrics-port: {exc}") from None
    err = Console(stderr=True, highlight=False, soft_wrap=True)

    import os

    model = os.environ.get(MODEL_ENV) or None

    def ready(worker: Worker) -> None:
        say(
            err,
            chosen_format,
            f"worker {worker.executor_id}: running queued runs of {describe(url)} "
            f"({worker.concurrency} at a time){model_note(model)}; Ctrl-C or SIGTERM stops it "
            f"(steps in flight get {worker.grace:g}s to finish)",
            executor_id=worker.executor_id,
        )
        for version, runs in sorted(worker.stranded.items()):
            say(
                err,
                chosen_format,
                f"warning: {len(runs)} queued or unfinished run(s) belong to {version}, a "
                f"newer minions: only a worker of that version runs them "
                f"(e.g. {', '.join(runs[:3])})",
            )

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
        model=model,
        tracer=None if tracer_provider is None else RunTracer(tracer_provider),
        metrics=None if exported is None else exported.metrics,
    )
    notifying = notifier(url, notify, stuck_after=notify_stuck_after)
    try:
        running = Worker(
            url,
            concurrency=concurrency,
            executor_id=executor_id,
            settings=settings,
            on_ready=ready,
            retention=retention,
            audit_retention=audit_retention_of(audit_retention),
            limits=given_limits,
            recipes=recipes,
            project_recipes=own_recipes,
            grace=grace,
        )
    except ValueError as exc:
        if notifying is not None:
            notifying.close()
        raise UsageError(f"--retention: {exc}") from None
    servers = _serve_probes(
        running, exported, (metrics_host, metrics_port), (health_host, health_port)
    )
    set_up_logging(chosen_format, database_url=url, minions_info=True)
    try:
        running.run()
    finally:
        if notifying is not None:
            notifying.close()
        for server in servers:
            server.close()
        if exported is not None:
            exported.shutdown()
        if tracer_provider is not None:
            tracer_provider.shutdown()  # sends the spans still batched
    if running.state == "failed":
        say(err, chosen_format, f"error: {running.error}")
        raise typer.Exit(1)
    say(err, chosen_format, "worker stopped; its unfinished runs go on in the next worker")


def _serve_probes(
    worker: Any,
    exported: Any,
    metrics: tuple[str, int | None],
    health: tuple[str, int | None],
) -> list[Any]:
    """The HTTP servers of `--metrics-port` and `--health-port` (one, when they are the same
    address), started.

    Raises:
        UsageError: an address cannot be bound.
    """
    from minions.cli._probes import ProbeServer, Route, probe

    wanted: dict[tuple[str, int], dict[str, Route]] = {}
    if metrics[1] is not None:
        wanted.setdefault((metrics[0], metrics[1]), {})["/metrics"] = lambda: (
            200,
            exported.content_type,
            exported.exposition(),
        )
    if health[1] is not None:
        routes = wanted.setdefault((health[0], health[1]), {})
        routes["/health/live"] = probe(lambda: None)
        routes["/health/ready"] = probe(worker.readiness)
    servers = []
    try:
        for (host, port), routes in wanted.items():
            servers.append(ProbeServer(host, port, routes))
    except OSError as exc:
        for server in servers:
            server.close()
        option = "--metrics-port" if (host, port) == metrics else "--health-port"
        raise UsageError(f"{option}: cannot listen on {host}:{port}: {exc.strerror}") from None
    return servers


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
    project: ProjectOption = None,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """Queue a run of a recipe for the workers, in a project; print its id (--json: and
    whether this submit queued it, false when --idempotency-key named it before)."""
    given = parse_inputs(inputs or ())
    if not recipe.is_file():
        raise UsageError(f"no such recipe file: {str(recipe)!r}")
    store = open_store(database_url, create=True)
    try:
        submitted = asyncio.run(
            store.submit(
                recipe,
                given,
                idempotency_key=idempotency_key,
                actor=cli_who(),
                project=project or "default",
            )
        )
    finally:
        store.close()
    said = {"run_id": submitted.run_id, "created": submitted.created}
    typer.echo(json.dumps(said) if json_output else submitted.run_id)
    if not _has_a_model(recipe):
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"note: no model is set here ({MODEL_ENV}), the recipe names none and no "
            "recording lies beside it: the run fails unless its worker has "
            f"{MODEL_ENV} set",
            markup=False,
            style="yellow",
        )


def _has_a_model(path: Path) -> bool:
    """Whether a run of the recipe file has a model to call, as far as this process can tell
    (a worker's environment may still set one)."""
    import os

    from minions.cli._model_choice import needs_model
    from minions.recipes import load_recipe_file
    from minions.recipes._internal import recording_beside

    recipe = load_recipe_file(path).recipe  # checked already by the store: it loads
    if recipe.model is not None or os.environ.get(MODEL_ENV):
        return True
    return recording_beside(path).is_file() or not needs_model(recipe.steps)


# -- runs ---------------------------------------------------------------------------------------


def list_runs(
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            help=f"{one_of(RUN_STATUSES)}.",
            show_default=False,
        ),
    ] = None,
    since: SinceOption = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            "--recipe", metavar="RECIPE", help="Runs of this recipe id.", show_default=False
        ),
    ] = None,
    schedule: Annotated[
        str | None,
        typer.Option(
            "--schedule", metavar="NAME", help="Runs this schedule fired.", show_default=False
        ),
    ] = None,
    project: Annotated[
        str | None,
        typer.Option(
            "--project", metavar="PROJECT", help="Runs of this project.", show_default=False
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 50,
    json_output: JsonOption = False,
    database_url: DatabaseOption = None,
) -> None:
    """The runs, newest first. On a terminal a long error is cut to fit; in a pipe (and with
    --json) it is whole."""
    after = since_time(since)
    store = open_store(database_url)
    try:
        try:
            records = asyncio.run(
                store.list_runs(
                    status=status,
                    recipe=recipe,
                    schedule=schedule,
                    created_after=after,
                    project=project,
                    limit=limit,
                )
            )
        except ValueError as exc:  # the store names the unknown status
            raise UsageError(str(exc)) from None
        history = asyncio.run(store.history())
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps([record_data(r) for r in records], indent=2))
        return
    err = Console(stderr=True, highlight=False)
    if history.pruned_before is not None:
        err.print(
            f"history kept from {local_time(history.oldest_at) or 'now'}: runs that finished "
            f"before {local_time(history.pruned_before)} were pruned "
            f"({local_time(history.pruned_at)})",
            markup=False,
        )
    if not records:
        err.print("no runs" + (f" {status}" if status else ""), markup=False)
        return
    out = stdout()
    cut = 60 if out.is_terminal else None
    if cut is None:  # a pipe: one line per run, its error whole
        out.width = max(out.width, 200 + max(len(r.error or "") for r in records))
    table = Table(show_edge=False, pad_edge=False)
    for name in ("run", "status", "recipe", "created", "time", "tokens", "error"):
        table.add_column(
            name,
            justify="right" if name in ("time", "tokens") else "left",
            no_wrap=name != "error" or cut is None,
        )
    for r in records:
        table.add_row(
            r.run_id,
            r.outcome,
            r.recipe_id,
            local_time(r.created_at),
            run_time(r),
            token_text(r.usage),
            plain(shortened(r.error or "", cut)),
        )
    out.print(table)


def _outcome(record: RunRecord) -> str:
    """How a run stands, for a person: ``rejected by alice`` for a run that failed after a
    person rejected one of its calls, else its status."""
    if record.outcome == "rejected":
        return f"rejected by {record.rejected_by}" if record.rejected_by else "rejected"
    return record.status


def show(
    run: RunArgument, json_output: JsonOption = False, database_url: DatabaseOption = None
) -> None:
    """A run: its status, every step that started or was skipped (status, start, time,
    tokens, the error of a failed one, else its output), its usage and error, and the calls
    it waits for."""
    from minions.cli._show import dead_worker_hint, shown_steps, steps_table

    async def read() -> tuple[Any, Any, list[Any]]:
        record = await store.get(run)
        if json_output:
            return record, None, []
        return record, await store.step_states(record), await store.workers()

    store = open_store(database_url)
    try:
        record, states, workers = asyncio.run(read())
    finally:
        store.close()
    if json_output:
        typer.echo(json.dumps(record_data(record), indent=2, ensure_ascii=False))
        return
    out = stdout()
    now = time.time()
    out.print(
        f"run {record.run_id}: {_outcome(record)} ({record.recipe_id})"
        + (f", {run_time(record)}" if record.started_at else "")
        + (f", {token_text(record.usage)} tokens" if token_text(record.usage) else ""),
        markup=False,
    )
    out.print(
        f"created {local_time(record.created_at)}"
        + (f" · worker {record.executor_id}" if record.executor_id else "")
        + (
            f" · schedule {record.schedule}, slot {local_time(record.slot)}"
            if record.schedule is not None
            else f" · rerun of {record.parent_run_id} from {record.from_step}"
            if record.parent_run_id
            else ""
        ),
        markup=False,
    )
    hint = dead_worker_hint(record, workers, now)
    if hint:
        out.print(hint, markup=False, style="yellow")
    steps = shown_steps(states, record.steps)
    if steps:
        out.print(steps_table(steps, now))
    for a in record.approvals:
        state = (
            "waiting"
            if a.decided_at is None
            else ("approved" if a.approved else f"rejected: {a.reason or ''}")
        )
        if a.decided_by is not None:
            state += f" (by {a.decided_by})"
        elif a.decided_at is None and a.due_at is not None:
            does = "fails the run" if a.on_timeout == "fail" else "rejects the call"
            state += f", times out in {spoken(max(0.0, round(a.due_at - now)))} ({does})"
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
        said = [s.error for s in steps if s.status == "failed" and len(s.error) >= 40]
        out.print(f"error: {once(record.error, said)}", markup=False, style="red")


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
    """A run's stored events, in order (JSON lines with --json).

    With --follow, new ones as they come until the run ends; the exit code is then 0 when it
    completed, 1 when it failed or was cancelled. With --follow --json, the text its models
    stream too, from whichever worker runs it (token_delta lines: never stored, no number of
    their own).
    """
    from minions.events import Event, event_to_json

    store = open_store(database_url)
    said: list[str] = []

    def show(event: Event) -> None:
        if json_output:
            typer.echo(event_to_json(event))
            return
        if event.kind == "token_delta":
            return  # text as it streams, many times a second: for --json readers
        detail = (
            _moved(event)
            or getattr(event, "error", None)
            or getattr(event, "name", None)
            or getattr(event, "reason", None)
            or ""
        )
        detail = once(detail, said)
        step = event.step_id or ""
        when = local_time(event.timestamp)
        typer.echo(
            " ".join(
                x for x in (f"{event.seq:>5} {when} {event.kind:<22}", step, detail) if x
            ).rstrip()
        )

    last = [""]  # the kind of the last event followed

    async def read() -> None:
        if follow:
            async for event in store.follow(run, after=after):
                show(event)
                followed(event)
                ticker.touch()
                last[0] = event.kind
        else:
            for event in await store.events(run, after=after):
                show(event)

    from minions.cli._progress import FollowedRun, Ticker

    followed = FollowedRun(run)
    # While a step runs long (a model call of minutes), a line now and then on stderr in a
    # pipe, a spinner on a terminal; the events alone keep silent meanwhile.
    ticker = Ticker(
        Console(stderr=True, highlight=False, soft_wrap=True),
        followed.line,
        live=sys.stdout.isatty(),
    )
    try:
        if follow:
            ticker.start()
        asyncio.run(read())
    except KeyboardInterrupt:
        pass
    finally:
        ticker.stop()
        store.close()
    if follow and last[0] == "run_failed":
        raise typer.Exit(1)  # the run failed or was cancelled: a script following it can tell


def cancel(
    ctx: typer.Context,
    run: RunArgument,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask first (a terminal asks).")
    ] = False,
    database_url: DatabaseOption = None,
) -> None:
    """Cancel a run: a queued one at once, a running one at its next step boundary.

    On a terminal it asks first (the run, its recipe and status) unless --yes; a script or a
    pipe (stdin or stderr not a terminal) is never asked, and the run is cancelled.
    """
    from minions.cli._cancel import confirmed

    store = open_store(database_url)
    try:
        if not yes and not confirmed(ctx, store, run):
            raise typer.Exit(1)
        record = asyncio.run(store.cancel(run, actor=cli_who()))
    finally:
        store.close()
    typer.echo(f"run {record.run_id}: {record.status}")


def resume(run: RunArgument, database_url: DatabaseOption = None) -> None:
    """Queue a failed or cancelled run again: it goes on from its last completed step."""
    store = open_store(database_url)
    try:
        record = asyncio.run(store.resume(run, actor=cli_who()))
    finally:
        store.close()
    typer.echo(f"run {record.run_id}: {record.status}")


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
    store = open_store(database_url)
    try:
        record = asyncio.run(
            store.approve(run, call_id, approved=reject is None, reason=reject, actor=cli_who())
        )
    finally:
        store.close()
    typer.echo(f"run {record.run_id}: {'rejected' if reject is not None else 'approved'}")
