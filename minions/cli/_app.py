"""The `minions` command: `run`, `validate`, `graph`, `schema` and `--version` here, and every
other command (`worker`, `submit`, `serve`, `audit`, `workers`, `queue`, `usage`, `plan`) and
group (`runs`, `schedules`, `endpoints`, `cache`, `keys`, `eval`) registered here from its
module, one way, in one table (`_register`).

Each command is a thin layer over the library; errors the user can fix (bad options, an invalid
recipe or inputs) print a readable message on stderr and exit with code 2, never a traceback.
The options and helpers several commands share are in `minions.cli._common`, the exit codes
and the event loop of a foreground run in `minions.cli._loop`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from typer.core import TyperGroup

from minions._version import __version__
from minions.cli._common import InputsOption, asker
from minions.cli._errors import UsageError
from minions.cli._limits import LimitsOption
from minions.cli._loop import EXIT_INTERRUPTED, EXIT_USAGE
from minions.cli._report import plural
from minions.cli._running import RunOptions, run_in_foreground
from minions.errors import InputError, MinionsError, RecipeError
from minions.models import Model

__all__ = ["app"]


def _infer_model(spec: str) -> Model:
    from minions.models import infer_model

    return infer_model(spec)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the commands take from their surroundings. Pass another as the click context
    object (``app(obj=Settings(...))``, ``CliRunner().invoke(app, args, obj=...)``) to run the
    command with, say, a test model.

    Attributes:
        resolve_model: turns a model string into a `Model`: the run's, and each one the recipe
            or a step names.
    """

    resolve_model: Callable[[str], Model] = _infer_model
    ask: Callable[[str], str] | None = None
    """Asks a person a question (approvals, whether to cancel a run); by default the terminal
    when stdin and stderr are one, else nobody can be asked."""


app = typer.Typer(
    name="minions",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _stderr() -> Console:
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = max(console.width, 200)  # tables keep ids whole in pipes and logs
    return console


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn the errors a user can fix into a message on stderr and exit code 2."""
    try:
        yield
    except InputError as exc:
        # Said for a command line: the inputs' names as `-i` options, not as fields.
        err = _stderr()
        err.print(f"invalid inputs: {plural(len(exc.problems), 'problem')}", style="red")
        for problem in exc.problems:
            err.print(f"  {problem.message}", markup=False)
        named = [
            p.field.removeprefix("inputs.")
            for p in exc.problems
            if p.field and not p.message.startswith("unknown")
        ]
        example = f", e.g. -i {named[0]}=..." if named else ""
        err.print(f"hint: give inputs as -i NAME=VALUE{example}", markup=False)
        raise typer.Exit(EXIT_USAGE) from None
    except RecipeError as exc:
        err = _stderr()
        count = len(exc.problems)
        err.print(f"invalid {exc.what}: {count} problem{'s' if count != 1 else ''}", style="red")
        for problem in exc.problems:
            err.print(f"  {problem}", markup=False)
        raise typer.Exit(EXIT_USAGE) from None
    except (UsageError, MinionsError) as exc:
        _stderr().print(f"error: {exc}", markup=False, style="red")
        raise typer.Exit(EXIT_USAGE) from None
    except KeyboardInterrupt:
        # Ctrl-C before the run started (while loading the recipe, say).
        _stderr().print("interrupted", style="yellow")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"minions {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Run LLM agents as steps: YAML recipes, from the command line.

    Exit codes: 0 the run completed, 1 it failed, 2 bad usage or an invalid recipe or inputs,
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
    """


RecipeArgument = Annotated[
    Path, typer.Argument(metavar="RECIPE", help="The recipe file (YAML).", show_default=False)
]


@app.command()
def run(
    ctx: typer.Context,
    recipe: RecipeArgument,
    inputs: InputsOption = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            metavar="MODEL",
            help="The model, e.g. openai:gpt-4o-mini or ollama:llama3.2:3b. Default: the "
            "recipe's model, else $MINIONS_MODEL, else the recording beside the recipe.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Check the recipe and inputs and print the plan; call nothing."
        ),
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the result as JSON, and nothing else, on stdout."),
    ] = False,
    events: Annotated[
        Path | None,
        typer.Option(
            "--events",
            metavar="FILE",
            help="Write every event as a JSON line to FILE as it happens.",
            show_default=False,
        ),
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            metavar="FILE",
            help="Save every model reply to FILE (a recording to --replay later).",
            show_default=False,
        ),
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            metavar="FILE",
            help="Answer every model call from a recording: offline, no model needed.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="No live view, progress, notes or summary: the output only."
        ),
    ] = False,
    preflight: Annotated[
        bool,
        typer.Option(
            "--preflight/--no-preflight",
            help="Check that the model servers answer before the first step runs.",
        ),
    ] = True,
    approve_all: Annotated[
        bool,
        typer.Option(
            "--approve-all",
            help="Approve every call of tools that need a person's approval (otherwise a "
            "terminal asks, and without one the run does not start).",
        ),
    ] = False,
    workspace: Annotated[
        Path | None,
        typer.Option(
            "--workspace",
            metavar="DIR",
            help="The folder the file tools work in. Default: the recipe's `workspace:`, "
            "else .minions/workspace/<recipe id> here.",
            show_default=False,
        ),
    ] = None,
    otel: Annotated[
        bool,
        typer.Option(
            "--otel",
            help="Send OpenTelemetry spans of the run (GenAI conventions) to the OTLP endpoint "
            "of the OTEL_EXPORTER_OTLP_* variables. Needs opentelemetry-sdk and "
            "opentelemetry-exporter-otlp-proto-http.",
        ),
    ] = False,
    limits: LimitsOption = None,
) -> None:
    """Run a recipe.

    A live view of the steps on stderr, then the output on stdout and a summary on stderr.
    """
    settings = ctx.find_object(Settings) or Settings()
    options = RunOptions(
        recipe=recipe,
        inputs=tuple(inputs or ()),
        model=model,
        dry_run=dry_run,
        json=json_output,
        events=events,
        record=record,
        replay=replay,
        workspace=workspace,
        approve_all=approve_all,
        quiet=quiet,
        preflight=preflight,
        otel=otel,
        limits=limits,
    )
    ask = asker(settings.ask)
    with _user_errors():
        code = run_in_foreground(options, resolve=settings.resolve_model, err=_stderr(), ask=ask)
    raise typer.Exit(code)


@app.command()
def validate(
    recipe: RecipeArgument,
    no_import: Annotated[
        bool,
        typer.Option(
            "--no-import",
            help="Run none of the recipe's code: check that its tool modules exist without "
            "importing them (tool names and parameters are then not checked).",
        ),
    ] = False,
) -> None:
    """Check a recipe.

    Prints OK and its step count, or every problem with its file and line (exit code 2).
    A recipe is code: its `tools:` modules are imported, unless --no-import.
    """
    from minions.recipes import load_recipe_file

    with _user_errors():
        loaded = load_recipe_file(recipe, import_tools=not no_import)
    steps = len(loaded.recipe.steps)
    note = ""
    if no_import and loaded.spec.tools:
        note = f"; {plural(len(loaded.spec.tools), 'tool module')} found, not imported"
    typer.echo(f"OK: {recipe} ({loaded.recipe.id}, {plural(steps, 'step')}{note})")


@app.command()
def graph(recipe: RecipeArgument) -> None:
    """Print a recipe as a Mermaid flowchart."""
    from minions._agent.graph import StepGraph
    from minions.recipes import load_recipe

    with _user_errors():
        typer.echo(StepGraph(load_recipe(recipe)).to_mermaid(), nl=False)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the recipe format.

    For editors with the YAML language server: save it, then start recipes with a comment
    pointing at it:

    \b
        minions schema > recipe.schema.json
        # yaml-language-server: $schema=recipe.schema.json
    """
    from minions.recipes import RecipeSpec

    data = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "minions recipe",
        **{k: v for k, v in RecipeSpec.model_json_schema().items() if k != "title"},
    }
    typer.echo(json.dumps(data, indent=2))


Commands = Sequence[tuple[str, Callable[..., None]]]


def _group(
    name: str, about: str, commands: Commands, cls: type[TyperGroup] | None = None
) -> typer.Typer:
    """A group of commands (``minions NAME COMMAND``), in this order in its help (`cls`: a
    group class of its own, to parse its arguments its way)."""
    group = typer.Typer(
        name=name,
        cls=cls,
        help=about,
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode=None,
    )
    for command, function in commands:
        group.command(command)(_user_errors_of(function))
    return group


def _register() -> None:
    """The commands whose work is in a module of their own, and the groups of commands:
    every one registered here, the same way."""
    from minions.cli import (
        _audit,
        _cache,
        _endpoints,
        _eval,
        _fleet,
        _keys,
        _plan,
        _prune,
        _rerun,
        _runs,
        _runs_step,
        _schedules,
        _serve,
    )

    for command, function in (
        ("worker", _runs.worker),
        ("submit", _runs.submit),
        ("serve", _serve.serve_command),
        ("audit", _audit.audit),
        ("workers", _fleet.workers),
        ("queue", _fleet.queue),
        ("usage", _fleet.usage),
        ("plan", _plan.plan_command),
    ):
        app.command(name=command)(_user_errors_of(function))
    runs = _group(
        "runs",
        "List, show, follow, cancel, resume, approve, rerun and diff durable runs; show one "
        "step of a run.",
        [
            ("list", _runs.list_runs),
            ("show", _runs.show),
            ("step", _runs_step.step),
            ("events", _runs.events),
            ("cancel", _runs.cancel),
            ("resume", _runs.resume),
            ("approve", _runs.approve),
            ("prune", _prune.prune),
            ("rerun", _rerun.rerun),
            ("diff", _rerun.diff),
        ],
    )
    schedules = _group(
        "schedules",
        "Run recipes by themselves, on a cron expression or an interval: add, list, show, "
        "pause, resume and remove schedules. The workers of the store fire them.",
        [
            ("add", _schedules.add),
            ("list", _schedules.list_schedules),
            ("show", _schedules.show),
            ("pause", _schedules.pause),
            ("resume", _schedules.resume),
            ("remove", _schedules.remove),
        ],
    )
    endpoints = _group(
        "endpoints",
        "Model endpoints: their load under the limits now, and what they taught the "
        "structured-output ladder of the store's workers.",
        [
            ("status", _fleet.endpoints_status),
            ("list", _endpoints.list_endpoints),
            ("forget", _endpoints.forget),
        ],
    )
    keys = _group(
        "keys",
        "Named API keys with roles for `minions serve`: add (prints the key once), list, revoke.",
        [("add", _keys.add), ("list", _keys.list_keys), ("revoke", _keys.revoke)],
    )
    evals = _group(
        "eval",
        _eval.EVAL_HELP,
        [
            ("run", _eval.eval_command),
            ("compare", _eval.compare_command),
            ("add-case", _eval.add_case_command),
        ],
        cls=_eval.EvalGroup,
    )
    cache = _group(
        "cache",
        _cache.CACHE_HELP,
        [("list", _cache.list_entries), ("clear", _cache.clear)],
    )
    for group in (runs, schedules, endpoints, cache, keys, evals):
        app.add_typer(group, name=group.info.name)


def _user_errors_of(function: Callable[..., None]) -> Callable[..., None]:
    """`function`, with `_user_errors` around it (signature kept for typer)."""
    import functools

    @functools.wraps(function)
    def wrapped(*args: object, **kwargs: object) -> None:
        with _user_errors():
            function(*args, **kwargs)

    return wrapped


_register()
