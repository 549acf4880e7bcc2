"""`minions serve`: the REST API, its event streams and the console, with a worker in the same
process unless `--no-worker` (see docs/service.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from minions.cli._common import (
    AUDIT_RETENTION,
    GRACE,
    AuditRetentionOption,
    ConcurrencyOption,
    DatabaseOption,
    GraceOption,
    LogFormatOption,
    ProjectRecipesOption,
    RetentionOption,
    audit_retention_of,
    check_recipes_root,
    chosen_log_format,
    model_note,
    project_folders,
    say,
    set_up_logging,
)
from minions.cli._errors import UsageError
from minions.cli._limits import LimitsOption, load_limits
from minions.cli._notify import NotifyOption, StuckAfterOption, notifier
from minions.models import MODEL_ENV

__all__: list[str] = []


def serve_command(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="HOST",
            help="The address to bind. Keep 127.0.0.1 unless a TLS reverse proxy is in front.",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, metavar="PORT", help="The port.")
    ] = 8000,
    recipes: Annotated[
        Path | None,
        typer.Option(
            "--recipes",
            metavar="DIR",
            envvar="MINIONS_RECIPES",
            help="The folder of the recipes clients may run, by id (its YAML files, searched "
            "recursively); the in-process worker finds every run's recipe file there by id "
            "(default: $MINIONS_RECIPES).",
            show_default=False,
        ),
    ] = None,
    project_recipes: ProjectRecipesOption = None,
    no_worker: Annotated[
        bool,
        typer.Option(
            "--no-worker",
            help="Serve only; run the runs in `minions worker` processes on the same database.",
        ),
    ] = False,
    allow_inline_recipes: Annotated[
        bool,
        typer.Option(
            "--allow-inline-recipes",
            help="Accept recipe YAML in POST /runs (it may name only built-in tools and tools "
            "modules of --recipes DIR).",
        ),
    ] = False,
    request_timeout: Annotated[
        float,
        typer.Option(
            "--request-timeout",
            min=0.1,
            metavar="SECONDS",
            help="Seconds a client may take to send a request's head, then its body; a "
            "slower connection is closed.",
        ),
    ] = 10.0,
    max_connections: Annotated[
        int,
        typer.Option(
            "--max-connections",
            min=1,
            metavar="N",
            help="Connections served at once (event streams included); more are closed as "
            "they come. Fitted to the descriptor limit.",
        ),
    ] = 2000,
    trust_proxy_header: Annotated[
        str | None,
        typer.Option(
            "--trust-proxy-header",
            metavar="HEADER",
            help="Behind an authenticating proxy (SSO): the header in which it names the user "
            "(e.g. X-Forwarded-User), trusted only from --trusted-proxy addresses; the user "
            "acts as the named key of that name (minions keys add NAME --role ...).",
            show_default=False,
        ),
    ] = None,
    trusted_proxies: Annotated[
        list[str] | None,
        typer.Option(
            "--trusted-proxy",
            metavar="ADDR",
            help="The proxy's address or network, as this server sees it (repeat for more).",
            show_default=False,
        ),
    ] = None,
    database_url: DatabaseOption = None,
    retention: RetentionOption = None,
    audit_retention: AuditRetentionOption = AUDIT_RETENTION,
    limits: LimitsOption = None,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            help="Serve GET /metrics: Prometheus text of this process's metrics and the "
            "store's gauges (queue, workers, schedules, endpoints); it needs a key "
            "(needs minions[metrics]).",
        ),
    ] = False,
    metrics_public: Annotated[
        bool,
        typer.Option(
            "--metrics-public",
            help="Serve /metrics without the token (for a scraper on a trusted network).",
        ),
    ] = False,
    log_format: LogFormatOption = None,
    notify: NotifyOption = None,
    notify_stuck_after: StuckAfterOption = "15m",
    concurrency: ConcurrencyOption = 4,
    grace: GraceOption = GRACE,
) -> None:
    """Serve the REST API, the live event streams and the console at http://HOST:PORT/.

    With its worker (the default), stopping drains it as it does `minions worker`: nothing
    more is claimed, steps in flight finish within --grace, and unfinished runs are handed
    back to the queue.

    Every endpoint but the probes (/health, /health/live, /health/ready) needs
    "Authorization: Bearer KEY": a named key (`minions keys add NAME --role ROLE`), or the
    server's token, an admin key: $MINIONS_API_TOKEN, else one generated at the first start
    and kept beside the database (owner-only), printed once. /metrics needs a key too, unless
    --metrics-public.
    """
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UsageError(
            "minions serve needs FastAPI and uvicorn: pip install 'minions[service]'"
        ) from None
    from minions._text import redact_url as describe
    from minions.runs import database_url as resolve
    from minions.service import ServiceConfig, load_token, serve

    if no_worker:
        # Given on the command line they are a mistake; from the environment (one shared by
        # the API and the workers: compose.yaml's) they are the workers'.
        for name, flag in (("grace", "--grace"), ("concurrency", "--concurrency")):
            source = ctx.get_parameter_source(name)
            if source is not None and source.name == "COMMANDLINE":
                raise UsageError(
                    f"{flag}: --no-worker runs no worker in this process; give it to "
                    "`minions worker`"
                )
    if retention is not None:
        if no_worker:
            raise UsageError("--retention: the worker prunes; give it to `minions worker`")
        from minions.runs import Retention

        try:
            Retention.parse(retention)
        except ValueError as exc:
            raise UsageError(f"--retention: {exc}") from None
    if trust_proxy_header is not None:
        from minions.service._guard import proxy_networks

        if not trusted_proxies:
            raise UsageError("--trust-proxy-header needs the proxy's address: --trusted-proxy ADDR")
        if not re.fullmatch(r"[A-Za-z0-9-]{1,100}", trust_proxy_header):
            raise UsageError(f"--trust-proxy-header: {trust_proxy_header!r} is not a header name")
        try:
            proxy_networks(trusted_proxies)
        except ValueError as exc:
            raise UsageError(f"--trusted-proxy: {exc}") from None
    elif trusted_proxies:
        raise UsageError("--trusted-proxy: give --trust-proxy-header too")
    if metrics_public and not metrics:
        raise UsageError("--metrics-public: give --metrics too")
    if metrics:
        try:
            import opentelemetry.exporter.prometheus
            import opentelemetry.sdk.metrics  # noqa: F401
            import prometheus_client  # noqa: F401
        except ImportError:
            raise UsageError(
                "--metrics needs the metrics extra: pip install 'minions[metrics]'"
            ) from None
    chosen_format = chosen_log_format(log_format)
    check_recipes_root(recipes)
    own_recipes = project_folders(project_recipes)
    url = resolve(database_url)
    given_limits = load_limits(limits)
    token = load_token(url)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if chosen_format == "json":
        set_up_logging(chosen_format, database_url=url, token=token.value)
    if token.new:
        say(
            err,
            chosen_format,
            f"API token (printed this once; kept in {token.file}, readable by you only):",
        )
        typer.echo(token.value)
    elif token.file is not None:
        say(err, chosen_format, f"API token: in {token.file}")
    else:
        say(err, chosen_format, "API token: $MINIONS_API_TOKEN")
    shown = f"[{host}]" if ":" in host else host

    def ready(executor_id: str) -> None:
        worker = (
            f"; worker {executor_id} in this process ({concurrency} at a time; when stopped, "
            f"steps in flight get {grace:g}s to finish)"
            if executor_id
            else "; no worker"
        )
        say(
            err,
            chosen_format,
            f"minions serve: http://{shown}:{port}/ (console at /, API docs at /openapi.json) "
            f"over {describe(url)}{worker}{model_note(config.model) if executor_id else ''}"
            f"{'; metrics at /metrics' if metrics else ''}; "
            "Ctrl-C stops it",
        )

    config = ServiceConfig(
        token=token.value,
        database_url=url,
        recipes=recipes,
        project_recipes=own_recipes,
        allow_inline_recipes=allow_inline_recipes,
        model=os.environ.get(MODEL_ENV) or None,
        request_timeout=request_timeout,
        max_connections=max_connections,
        proxy_user_header=trust_proxy_header,
        trusted_proxies=tuple(trusted_proxies or ()),
        metrics=metrics,
        metrics_public=metrics_public,
    )
    notifying = notifier(url, notify, stuck_after=notify_stuck_after)
    try:
        serve(
            config,
            host=host,
            port=port,
            worker=not no_worker,
            retention=retention,
            audit_retention=audit_retention_of(audit_retention),
            on_ready=ready,
            limits=given_limits,
            log_format=chosen_format,
            concurrency=concurrency,
            grace=grace,
        )
    finally:
        if notifying is not None:
            notifying.close()
