"""The public API: exactly the names each public module exports, private modules private, and
what importing costs."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import minions

ERRORS = {
    "BudgetExceededError", "ConfigError", "InputError", "MinionsError", "ModelError",
    "ModelOutputError", "OutputValidationError", "Problem", "RecipeError", "RecordingError",
    "ScriptExhaustedError", "StepDefinitionError", "TemplateError", "TemplateSyntaxError",
    "ToolDefinitionError", "ToolError", "TransientModelError", "UnknownLinkError",
    "UnknownRecipeError", "RunStateError", "StoreError", "UnknownRunError",
    "ApprovalRequiredError", "MissingExtraError",
    "PlanError", "MCPServerError", "IdempotencyConflictError", "RerunError",
    "ScheduleExistsError", "UnknownScheduleError", "DiffTooLargeError", "UnknownStepError",
    "MissingDepsError", "Reask", "StepFailed", "StreamingWarning", "KeyExistsError",
    "UnknownKeyError", "UnknownProjectError",
}  # fmt: skip

PUBLIC: dict[str, set[str]] = {
    "minions": {
        "__version__",
        # messages and values
        "Message", "MessageBundle", "ModelCall", "ModelCallResponse", "Prompt", "ToolCall",
        "ToolCallResponse", "ToolSpec", "Usage",
        # memory
        "InMemoryModelMemory", "MemorySnapshot", "ModelMemory",
        # tools and models
        "Tool", "ToolCallExecutor", "ToolContext", "ToolRegistry", "tool", "Model",
        "ModelCallExecutor",
        # steps
        "AgentContext", "DefaultStep", "DecisionRecord", "ExecutionConfig", "MemoryScope",
        "OutputInstructions", "RunSettings", "CachePolicy", "CachedStep", "InMemoryStepCache",
        "StepCache", "Step", "StepExecution", "StepExecutor",
        "StepInput", "StepMode", "StepRun", "StepStatus", "StepStream",
        # step kinds
        "AnalysisStep", "LoopStep", "RecipeStep", "ToolStep",
        # completion chain
        "CallLimitLink", "CompletionDecision", "CompletionMarkerLink", "CompletionToolLink",
        "StepCompletionChain", "StepCompletionLink", "StructuredOutputLink", "TextAnswerLink",
        # agents
        "AgentExecutor", "AgentRecipe", "AgentResult", "Condition", "RunStream", "StepGraph",
        "StepManager", "Transition", "load_recipe", "recipe_problems",
        # next-step selection
        "ConditionLink", "FirstCandidateLink", "ModelChoiceLink", "Routing",
        "SelectionDecision", "SelectionRequest", "SingleCandidateLink", "StepSelectionChain",
        "StepSelectionLink", "StepSuggestionLink",
        # plans from requirements
        "Plan", "PlanGenerator", "PlanResult", "PlanStep", "TaskStep", "TokenLine",
        # errors: every one of minions.errors
        *ERRORS,
    },
    "minions.events": {
        "Event", "EventEmitter", "EventListener", "UsageRecord", "MessageRecord",
        "event_from_json", "event_to_json", "RunStarted", "RunCompleted", "RunFailed", "StepStarted",
        "StepCompleted", "StepFailed", "StepSkipped", "ModelCallStarted", "ModelCallWaiting",
        "ModelCallCompleted", "ModelCallFailed", "TokenDelta", "ToolCallStarted", "ToolCallCompleted",
        "ToolCallFailed", "RetryScheduled", "CompletionDecided", "RoutingDecided",
        "OutputModeDemoted", "ApprovalRequested", "ApprovalResolved", "ApprovalEscalated",
        "PlanRevised", "RerunPlanned", "StepReused", "StepCached", "RunResumed", "RunDraining",
        "RunHandedBack", "RunTakenOver", "RunRequeued",
    },
    "minions.errors": ERRORS,
    "minions.models": {
        "CapabilityMemory", "EndpointLimit", "EndpointLimiter", "ProjectLimit", "EndpointPermit", "EndpointWait",
        "Evidence", "FallbackModel", "Limits", "LocalLimiter",
        "MODEL_ENV", "ModeDemotion", "Model", "OpenAIChatModel", "OutputMode", "Recording",
        "RecordingModel", "ReplayMissError", "ReplayModel", "TokenCallback", "infer_model",
    },
    "minions.tools": {
        "ApprovalDecision", "ApprovalRequest", "Approver",
        "Tool", "ToolContext", "ToolRegistry", "builtin_tools", "current_datetime",
        "file_tools", "http_get_tool", "tool", "tool_context",
        "MCPHttpServer", "MCPStdioServer",
    },
    "minions.runs": {
        "ApprovalRecord", "EndpointRecord", "EvalRecord", "RunFilters", "RunRecord", "RunStore", "StepRecord",
        "WorkerRecord", "database_url", "EventLog", "LiveHub", "STATUSES", "Worker",
        "WorkerConflictError", "ScheduleRecord", "PruneResult", "History",
        "RerunPlan", "RunDiff", "StepDiff", "Retention", "FleetState", "EndpointLoad",
        "StepDetail", "KeyRecord", "ROLES", "Role", "Scope", "ScopedRuns", "EndpointPause",
        "Lesson", "Actor", "AuditEntry", "AUDIT_ACTIONS", "EndpointStatus", "QueueState",
        "QueuedRun", "UsageReport", "UsageRow", "Delivery", "Notifier", "NotifyTarget",
        "QueuedRecipe", "ScheduleState", "CacheEntry", "NewKey", "Submitted", "OpenedEval",
        "RecipeNode",
    },
    "minions.service": {
        "TOKEN_ENV", "ServiceConfig", "Token", "create_app", "load_token", "serve",
    },
    "minions.recipes": {
        "AgentRecipe", "InputSpec", "RecipeFile", "RecipeStep", "dump_recipe", "load_recipe",
        "load_recipe_file", "parse_recipe", "recipe_problems", "RecipeSpec", "parse_spec", "Located",
    },
    "minions.testing": {
        "FakeOpenAIServer", "FakeReply", "FakeRequest", "FakeScript", "FunctionModel", "ModelBlock",
        "Quirk", "block_real_models",
        "Reply", "ScriptedModel", "TestModel", "estimate_tokens",
    },
    "minions.evals": {
        "NOT_GIVEN", "Case", "Dataset", "DatasetError", "Target", "load_dataset",
        "parse_dataset", "add_case", "case_text",
        "Check", "CheckResult", "ExpectedCheck", "ExprCheck", "FunctionCheck", "Grading",
        "JudgeCheck", "ToolExpectation", "TrajectoryCheck", "Judge", "Verdict",
        "CaseJob", "CaseRun", "CaseRunFinished", "CaseRunStarted", "CaseRunner",
        "DurableRunner", "ForegroundRunner", "GradedRun", "TokenBudget", "evaluate",
        "evaluate_durable", "evaluate_sync",
        "CaseReport", "CheckReport", "Comparison", "EvalReport", "Failure", "GateReport",
        "Gates", "ReportError", "RunReport", "apply_gates", "compare_reports", "junit_xml",
        "pass_at_k", "pass_hat_k", "wilson_interval", "EvalCase", "dataset_cases",
    },
    "minions.cli": {"app", "main"},
}  # fmt: skip


def _private_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(minions.__path__, "minions."):
        if any(part.startswith("_") for part in info.name.split(".")[1:]):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_public_module_exports_exactly_its_names(module: str) -> None:
    public = importlib.import_module(module)
    assert sorted(public.__all__) == sorted(PUBLIC[module])
    assert len(public.__all__) == len(set(public.__all__))
    for name in public.__all__:
        assert getattr(public, name) is not None, name


def test_private_modules_list_only_what_a_public_module_exports() -> None:
    """A private module's `__all__` names public things (re-exported under a public path),
    never its helpers."""
    exported = {
        id(getattr(importlib.import_module(m), n)) for m, names in PUBLIC.items() for n in names
    }
    leaks = []
    for module_name in _private_modules():
        if module_name.endswith("__main__"):
            continue
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            if id(getattr(module, name)) not in exported:
                leaks.append(f"{module_name}.{name}")
    assert leaks == []


def test_every_public_name_has_a_docstring() -> None:
    missing = []
    for module, names in PUBLIC.items():
        for name in names:
            value = getattr(importlib.import_module(module), name)
            if (inspect.isclass(value) or inspect.isfunction(value)) and not value.__doc__:
                missing.append(f"{module}.{name}")
    assert missing == []


def test_step_status_values() -> None:
    assert [s.name for s in minions.StepStatus] == [
        "PENDING", "IN_PROGRESS", "COMPLETED", "FAILED", "SKIPPED",
    ]  # fmt: skip


def test_testing_doubles_are_public() -> None:
    from minions.testing import FunctionModel, ScriptedModel

    assert issubclass(ScriptedModel, minions.Model)
    assert issubclass(FunctionModel, minions.Model)


def test_import_stays_light() -> None:
    """Heavy dependencies load on first use, not on `import minions`."""
    code = (
        "import sys, minions; "
        "heavy = ['openai', 'instructor', 'pydantic', 'structlog', 'jmespath', 'yaml', "
        "'jsonschema', 'tenacity', 'httpx', 'httpx2', 'rich', 'typer', "
        "'minions._agent', 'minions.recipes']; "
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == ""


def test_lazy_names_resolve_once_and_are_listed() -> None:
    from minions.recipes import load_recipe

    assert "load_recipe" in dir(minions)
    assert minions.load_recipe is load_recipe
    assert "load_recipe" in vars(minions)  # cached after the first lookup
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        minions.NoSuchName  # noqa: B018


USER_CODE = """\
from minions import AgentContext, DefaultStep, StepExecutor
from minions.testing import ScriptedModel

step = DefaultStep("greet", "Say hello.")
reveal_type(step.id)
execution = StepExecutor(step, AgentContext(model=ScriptedModel(["Hello!"]))).execute_sync()
reveal_type(execution.usage.total_tokens)
wrong: int = step.id
"""


@pytest.mark.slow
def test_a_users_type_checker_sees_the_types(tmp_path: Path) -> None:
    # The package says "Typing :: Typed": without `py.typed`, mypy skipped it as untyped and
    # saw `Any` everywhere (issue 25).
    assert (Path(minions.__file__).parent / "py.typed").is_file()
    (tmp_path / "user.py").write_text(USER_CODE)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file=", "user.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = checked.stdout
    assert "import-untyped" not in out
    assert 'user.py:5: note: Revealed type is "builtins.str"' in out or (
        'user.py:5: note: Revealed type is "str"' in out
    )
    assert 'user.py:7: note: Revealed type is "builtins.int"' in out or (
        'user.py:7: note: Revealed type is "int"' in out
    )
    assert 'user.py:8: error: Incompatible types in assignment (expression has type "str", ' in out
    assert checked.returncode == 1, out


@pytest.mark.parametrize("package", ["dbos", "sqlalchemy", "psycopg"])
def test_durable_runs_name_their_extra_when_it_is_missing(package: str, tmp_path: Path) -> None:
    """The base install is the step loop: durable runs are the `durable` extra, and a command
    that needs it says which package is missing and what to install (exit 2, no traceback)."""
    code = (
        f"import sys; sys.modules[{package!r}] = None; sys.argv = ['minions', 'runs', 'list']; "
        "from minions.cli import main; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.returncode == 2
    assert f"({package} not installed): pip install 'minions[durable]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_base_install_does_not_require_the_durable_extra() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("[")[0] for d in project["dependencies"]}
    assert names.isdisjoint({"dbos", "sqlalchemy", "psycopg"})
    assert project["optional-dependencies"]["service"][0] == "minions[durable]"


def test_a_recipe_is_checked_as_data_then_built_without_a_second_parse(tmp_path: Path) -> None:
    """`parse_spec` (public) checks YAML against the format without importing its tools; its
    `RecipeSpec` and `Located` build the recipe through `load_recipe_file(parsed=...)`."""
    from minions.errors import RecipeError
    from minions.recipes import Located, RecipeSpec, load_recipe_file, parse_spec

    unbuilt = "id: hello\ntools: [no_such_module:tool]\nsteps:\n  - id: greet\n    goal: Hi.\n"
    spec, located = parse_spec(unbuilt)  # its tools module is not imported
    assert isinstance(spec, RecipeSpec)
    assert isinstance(located, Located)
    assert (spec.id, spec.tools, spec.steps[0].id) == ("hello", ["no_such_module:tool"], "greet")
    assert located.line(["steps", 0, "goal"]) == 5
    with pytest.raises(RecipeError, match=r"r\.yaml:4: step 'greet', field 'gaol': unknown"):
        parse_spec("id: hello\nsteps:\n  - id: greet\n    gaol: Hi.\n", file="r.yaml")

    text = "id: hello\nsteps:\n  - id: greet\n    goal: Hi.\n"
    built = load_recipe_file(tmp_path / "hello.yaml", text=text, parsed=parse_spec(text))
    assert [step.id for step in built.recipe.steps] == ["greet"]
    assert built.spec.id == "hello"
    assert built.located.line(["steps", 0, "goal"]) == 4
