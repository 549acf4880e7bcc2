"""`PlanGenerator`: requirements in, a checked `Plan` out; and a plan's run, replanning the
rest when a step fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from minions._agent.executor import AgentExecutor
from minions._config import ExecutionConfig
from minions._kinds.task import READ_TOOL, artifacts_text, staged_files
from minions._messages import Message, ToolCall
from minions._output import OutputInstructions
from minions._plan.plan import Plan, PlanStep, TokenLine, ToolLike
from minions._plan.result import PlanResult, token_line
from minions._routing.selection import Routing
from minions._step.completion import (
    CompletionDecision,
    StepCompletionChain,
    StructuredOutputLink,
)
from minions._step.context import AgentContext
from minions._step.execution import StepExecution, StepStatus
from minions._step.step import Step, StepInput
from minions._step.tool_call import ToolCallExecutor
from minions.errors import OutputValidationError, PlanError, Problem
from minions.events import EventEmitter, EventListener, PlanRevised, UsageRecord
from minions.models import Model
from minions.recipes import AgentRecipe
from minions.tools import builtin_tools

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["PlanGenerator"]

PLANNER_SYSTEM = (
    "You plan work for other agents. Split the requirements into a few steps that each do one "
    "thing. A step sees only its goal, the files it lists as inputs and the artifacts of the "
    "steps it depends on, so write each goal to stand alone. Answer with JSON only."
)
"""The planner's system prompt."""

_RULES = (
    "Step types: analyze (study inputs, report findings), generate (write new files), modify "
    "(change existing files), validate (check earlier artifacts), cleanup (tidy up, summarise). "
    "Ids are letters, digits, '_' or '-'. List in inputs only the workspace files a step must "
    "read, and in depends_on only the steps whose artifacts it needs; steps that do not need "
    "each other run at the same time."
)

_PLANNER_CONFIG = ExecutionConfig(max_model_calls_per_step=1, max_output_retries=1)
"""One answer, and one re-ask with the problems when it is not a valid plan."""


class PlanGenerator:
    """Turns requirements into a `Plan` through structured output, and runs plans.

    The planner answers through the structured-output ladder (native JSON Schema, a tool
    call, or prompted JSON with repair), so small local models can plan too. A plan that is
    not valid as a recipe (a malformed or duplicate id, an unknown dependency, a cycle, an
    unknown tool) is sent back once with the problems; a second invalid answer raises
    `PlanError`.

    Args:
        model: the planner's model (a `Model` or a model string).
        listeners: callables receiving the planner's events.
        model_wrapper: applied to the planner's model (recording...).
        tracer_provider: where OpenTelemetry spans go (see `AgentExecutor`): each request to
            the planner is a ``plan`` span holding the planner's run, and `execute` traces
            the plan's run too. Needs ``minions[otel]``.
        capture_message_content: write prompts and answers on spans (see `AgentExecutor`).
    """

    def __init__(
        self,
        model: Model | str | None = None,
        *,
        listeners: Iterable[EventListener] = (),
        model_wrapper: Callable[[Model], Model] | None = None,
        tracer_provider: TracerProvider | None = None,
        capture_message_content: bool | None = None,
    ) -> None:
        self.model = model
        self.listeners = list(listeners)
        self.model_wrapper = model_wrapper
        self.tracer_provider = tracer_provider
        self.capture_message_content = capture_message_content

    def _executor(self, listeners: Iterable[EventListener] = ()) -> AgentExecutor:
        return AgentExecutor(
            model=self.model,
            listeners=list(listeners),
            model_wrapper=self.model_wrapper,
            tracer_provider=self.tracer_provider,
            capture_message_content=self.capture_message_content,
        )

    @contextlib.contextmanager
    def _plan_span(self, request: str) -> Iterator[None]:
        """A ``plan`` span around one request to the planner (the first plan or a replan)."""
        if self.tracer_provider is None:
            yield
            return
        from minions._tracing import semconv as sc
        from minions._version import __version__

        tracer = self.tracer_provider.get_tracer("minions", __version__)
        attributes = {
            sc.OPERATION_NAME: sc.OPERATION_PLAN,
            sc.OPENINFERENCE_SPAN_KIND: sc.OPENINFERENCE_KINDS[sc.OPERATION_PLAN],
            sc.MINIONS_PLAN_REQUEST: request,
        }
        with tracer.start_as_current_span(sc.OPERATION_PLAN, attributes=attributes):
            yield

    async def generate(
        self,
        requirements: str,
        *,
        tools: Sequence[str | ToolLike] = ("read_file", "write_file"),
        workspace: str | Path | None = None,
    ) -> Plan:
        """A checked plan for `requirements`.

        Args:
            requirements: what to build or do.
            tools: the tools steps may use: names of built-in tools (``read_file``,
                ``write_file``, ``list_files``, ``current_datetime``) or `Tool` objects.
            workspace: the folder the plan works in; its files are listed for the planner.

        Raises:
            PlanError: empty requirements, an unknown tool, a workspace that does not exist,
                or no valid plan after one re-ask; nothing has run.
        """
        if not isinstance(requirements, str) or not requirements.strip():
            raise PlanError(
                [
                    Problem(
                        file="plan", message="the requirements are empty: say what to build or do"
                    )
                ]
            )
        names, objects = _tool_choice(tools)
        files = _workspace_files(workspace)
        parts = [f"Requirements: {requirements.strip()}"]
        if files is not None:
            parts.append("Files in the workspace: " + (", ".join(files) or "none"))
        parts.append("Tools a step may call: " + (", ".join(names) or "none"))
        parts.append(_RULES)
        plan, line = await self._ask(
            "plan", "planner", "\n\n".join(parts), names, objects, (), workspace=workspace
        )
        plan._tokens.append(line)
        return plan

    async def replan(
        self,
        requirements: str,
        plan: Plan,
        *,
        completed: Mapping[str, Any],
        failed: str,
        reason: str,
        replan: int = 1,
        tools: Sequence[str | ToolLike] = ("read_file", "write_file"),
        workspace: str | Path | None = None,
        listeners: Iterable[EventListener] = (),
    ) -> tuple[Plan, TokenLine]:
        """A revised plan: the completed steps kept as they are, new steps for the rest.

        The planner gets the requirements, the plan, what completed (with its artifacts) and
        the failure, and answers with the remaining steps, which may depend on completed
        ones.

        Raises:
            PlanError: no valid revised plan after one re-ask.
        """
        names, objects = _tool_choice(tools)
        steps = [s.model_dump(exclude_defaults=True) for s in plan.steps]
        done = "\n\n".join(artifacts_text(k, v) for k, v in completed.items()) or "nothing"
        goal = "\n\n".join(
            [
                f"Requirements: {requirements.strip()}",
                "The plan: " + json.dumps(steps, ensure_ascii=False, separators=(",", ":")),
                f"Completed steps (kept, not run again):\n{done}",
                f"Step {failed!r} failed: {reason}",
                "Answer with a revised plan for the remaining work only: do not repeat the "
                "completed steps; new steps may depend on them by id. Tools a step may call: "
                + (", ".join(names) or "none"),
                _RULES,
            ]
        )
        kept = [s for s in plan.steps if s.id in completed]
        revised, line = await self._ask(
            f"replan_{replan}",
            f"replan {replan}",
            goal,
            names,
            objects,
            kept,
            listeners,
            workspace=workspace,
        )
        return _merged(revised, kept), line

    async def _ask(
        self,
        step_id: str,
        label: str,
        goal: str,
        names: Sequence[str],
        objects: Sequence[ToolLike],
        kept: Sequence[PlanStep],
        listeners: Iterable[EventListener] = (),
        *,
        workspace: str | Path | None = None,
    ) -> tuple[Plan, TokenLine]:
        check = _PlanCheck(tools=objects, allowed=names, kept=kept, workspace=workspace)
        step = _PlannerStep(
            step_id,
            [Message.system(PLANNER_SYSTEM), Message.user(goal)],
            completion=StepCompletionChain.default().replace("structured_output", check),
        )
        executor = self._executor([*self.listeners, *listeners])
        with self._plan_span(step_id):
            result = await executor.execute(AgentRecipe(id="planner", steps=[step]))
        execution = result.step(step_id)
        line = token_line(
            label,
            "planner" if label == "planner" else "replan",
            execution.model_calls,
            status=execution.status.value,
        )
        if execution.status is not StepStatus.COMPLETED:
            raise _NoPlan(
                line,
                [
                    Problem(
                        file="plan",
                        message=f"the planner gave no valid plan: {execution.error}",
                        step=label,
                    )
                ],
            )
        plan = execution.output
        assert isinstance(plan, Plan)
        return plan, line

    async def execute(
        self,
        plan: Plan,
        *,
        executor: AgentExecutor | None = None,
        requirements: str | None = None,
        workspace: str | Path | None = None,
        tools: Sequence[str | ToolLike] = ("read_file", "write_file"),
        max_replans: int = 2,
        listeners: Iterable[EventListener] = (),
    ) -> PlanResult:
        """Run a plan; when a step fails, replan the rest (at most `max_replans` times).

        Completed steps are kept with their artifacts and never run again; each replan emits
        `PlanRevised`. Steps that do not depend on each other run at the same time.

        Args:
            plan: the plan.
            executor: runs the steps (its model is the workers' model); a new one with the
                planner's model by default.
            requirements: what the plan is for, told to the planner when it replans; the
                plan's description by default.
            workspace: the folder the steps read and write files in (the current directory by
                default).
            tools: the tools steps may use (see `generate`).
            max_replans: how many times the rest of the plan may be revised.
            listeners: callables receiving every event (the steps', the planner's when it
                replans, and `PlanRevised`).

        A replan that gives no valid plan (after its one re-ask) ends the run: the result is
        FAILED and its `error` says why.

        Raises:
            PlanError: the plan is invalid, the workspace does not exist, or `max_replans` is
                negative (nothing has run).
        """
        if max_replans < 0:
            raise PlanError([Problem(file="plan", message="max_replans must not be negative")])
        _workspace_files(workspace)
        listeners = list(listeners)
        executor = executor or self._executor()
        _, objects = _tool_choice(tools)
        events = EventEmitter(f"plan-{uuid.uuid4().hex[:12]}", listeners)
        kept: dict[str, StepExecution] = {}
        tokens: list[TokenLine] = list(plan.tokens)
        revisions = [plan]
        runs = []
        latest: dict[str, StepExecution] = {}
        current = plan
        error: str | None = None
        for attempt in range(max_replans + 1):
            recipe = current.to_recipe(workspace=workspace, tools=objects)
            graph = executor.graph(recipe)
            context: AgentContext = executor.create_context(recipe, listeners=listeners)
            staged = await _stage(current, kept, workspace, context)
            with staged_files(staged):
                result = await executor.run(graph, context, checkpoints=_Kept(kept))
            runs.append(result)
            order = {s.id: i for i, s in enumerate(current.steps)}
            ran = sorted(result.executions, key=lambda e: order.get(e.step_id, len(order)))
            for execution in ran:
                restored = kept.get(execution.step_id) is execution
                if restored:
                    continue
                latest[execution.step_id] = execution
                if execution.status is StepStatus.SKIPPED:
                    continue
                tokens.append(
                    token_line(
                        execution.step_id,
                        "step",
                        execution.model_calls,
                        status=execution.status.value,
                    )
                )
                if execution.status is StepStatus.COMPLETED:
                    kept[execution.step_id] = execution
            if result.ok:
                error = None
                break
            error = result.error
            failed = next((e for e in result.executions if e.status is StepStatus.FAILED), None)
            if failed is None or attempt == max_replans:
                break
            completed = {k: kept[k].output for k in (s.id for s in current.steps) if k in kept}
            try:
                current, line = await self.replan(
                    requirements or plan.description,
                    current,
                    completed=completed,
                    failed=failed.step_id,
                    reason=failed.error or "it failed",
                    replan=attempt + 1,
                    tools=tools,
                    workspace=workspace,
                    listeners=listeners,
                )
            except _NoPlan as exc:
                tokens.append(exc.line)
                problem = exc.problems[0].message if exc.problems else str(exc)
                error = f"{error or failed.error}; replanning: {problem}"
                break
            tokens.append(line)
            revisions.append(current)
            events.emit(
                PlanRevised(
                    step_id=failed.step_id,
                    replan=attempt + 1,
                    reason=failed.error or "",
                    kept=tuple(completed),
                    steps=tuple(s.id for s in current.steps if s.id not in kept),
                    usage=UsageRecord(
                        prompt_tokens=line.prompt_tokens,
                        completion_tokens=line.completion_tokens,
                        calls=line.calls,
                    ),
                )
            )
        final = {s.id: kept.get(s.id) or latest.get(s.id) for s in current.steps}
        ok = all(e is not None and e.status is StepStatus.COMPLETED for e in final.values())
        return PlanResult(
            plan=current,
            status=StepStatus.COMPLETED if ok else StepStatus.FAILED,
            executions={k: v for k, v in final.items() if v is not None},
            runs=tuple(runs),
            revisions=tuple(revisions),
            tokens=tuple(tokens),
            error=None if ok else (error or "a step of the plan failed"),
        )


class _NoPlan(PlanError):
    """The planner gave no valid plan; `line` holds the tokens it spent."""

    def __init__(self, line: TokenLine, problems: Sequence[Problem]) -> None:
        super().__init__(problems)
        self.line = line


class _PlannerStep(Step):
    """The planner's one structured call: fixed messages (requirements are not templates)."""

    kind: ClassVar[str] = "planner"

    def __init__(self, id: str, messages: Sequence[Message], **options: Any) -> None:
        super().__init__(id, config=_PLANNER_CONFIG, **options)
        self.messages = list(messages)
        self.output = _PLAN_OUTPUT

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return list(self.messages)


_LIST = {"type": "array", "items": {"type": "string"}}
PLAN_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "description": {"type": "string"},
        "steps": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "type": {"enum": ["analyze", "generate", "modify", "validate", "cleanup"]},
                    "goal": {"type": "string"},
                    "inputs": _LIST,
                    "depends_on": _LIST,
                    "artifacts": _LIST,
                    "tools": _LIST,
                },
                "required": ["id", "type", "goal"],
            },
        },
    },
    "required": ["id", "description", "steps"],
}
"""The schema the planner answers in: `Plan`, kept small for small models (the rules are in
the prompt); the answer is then validated as a `Plan`."""

_PLAN_OUTPUT = OutputInstructions(PLAN_SCHEMA, name="plan")
_PLAN_MODEL = OutputInstructions(Plan, name="plan")
"""Validates an answer as a `Plan`, with a short note for the model when it is not one."""


class _PlanCheck(StructuredOutputLink):
    """The planner's answer is a plan: check it as a recipe, or re-ask with its problems."""

    name = "plan_check"

    def __init__(
        self,
        *,
        tools: Sequence[ToolLike],
        allowed: Sequence[str],
        kept: Sequence[PlanStep],
        workspace: str | Path | None = None,
    ) -> None:
        self.tools = tools
        self.allowed = allowed
        self.kept = kept
        self.workspace = workspace

    def check(self, execution: StepExecution, context: AgentContext) -> CompletionDecision | None:
        decision = super().check(execution, context)
        if decision is None or decision.kind != "complete":
            return decision
        try:
            plan = _PLAN_MODEL.validate_python(decision.output)
        except OutputValidationError as exc:
            return CompletionDecision.reask(str(exc))
        kept_ids = {s.id for s in self.kept}
        reused = [s.id for s in plan.steps if s.id in kept_ids]
        whole = _merged(plan, self.kept)
        problems = [
            p.describe()
            for p in whole.problems(
                tools=self.tools, allowed_tools=self.allowed, workspace=self.workspace
            )
        ]
        problems += [f"step {i!r} is completed already: do not plan it again" for i in reused]
        if problems:
            return CompletionDecision.reask(
                "The plan is not valid: " + "; ".join(problems) + ". Answer with a corrected plan."
            )
        return CompletionDecision.complete(plan, reason=decision.reason)


def _merged(revised: Plan, kept: Sequence[PlanStep]) -> Plan:
    """The kept steps, then the revised plan's steps (those that do not redo a kept one)."""
    if not kept:
        return revised
    ids = {s.id for s in kept}
    merged = revised.model_copy(
        update={"steps": [*kept, *(s for s in revised.steps if s.id not in ids)]}
    )
    merged._tokens = list(revised._tokens)
    return merged


async def _stage(
    plan: Plan, kept: Mapping[str, Any], workspace: str | Path | None, context: AgentContext
) -> dict[str, str]:
    """Read, once and at the same time, the inputs of the steps still to run that exist
    already and that no step of the plan produces (through the run's ``read_file`` tool): a
    step then waits for its dependencies, not for its reads as well. A file that cannot be
    read here is left for its step, which fails naming it."""
    produced = {a for s in plan.steps for a in s.artifacts}
    root = Path(workspace) if workspace is not None else Path.cwd()
    paths = sorted(
        {
            p
            for s in plan.steps
            if s.id not in kept
            for p in s.inputs
            if p not in produced and (root / p).is_file()
        }
    )
    if not paths or READ_TOOL not in context.tools:
        return {}
    tools = ToolCallExecutor(context.tools.subset([READ_TOOL]), config=context.config)
    calls = await asyncio.gather(
        *(
            tools.execute(ToolCall(id=f"stage-{i}", name=READ_TOOL, arguments={"path": p}))
            for i, p in enumerate(paths)
        )
    )
    return {
        p: str(c.response.result)
        for p, c in zip(paths, calls, strict=True)
        if c.response is not None and c.response.error is None
    }


class _Kept:
    """Checkpoints of the completed steps: a replanned run restores them, never re-runs them."""

    resumed = False
    """A replanned run is a run of its own: it says `RunStarted`."""
    attempt = None
    """It runs in the foreground, once."""
    parks = False
    """It runs in the foreground: a call waiting for a decision waits in place."""

    def __init__(self, kept: Mapping[str, StepExecution]) -> None:
        self.kept = kept

    async def restore(
        self, step_id: str, visit: int
    ) -> tuple[StepExecution, Routing | None] | None:
        found = self.kept.get(step_id)
        return (found, None) if found is not None and visit == 1 else None

    async def save(
        self, execution: StepExecution, routing: Routing | None, announce: Callable[[], None]
    ) -> None:
        announce()

    async def restore_item(self, name: str, visit: int) -> StepExecution | None:
        return None

    def resume_at(self, scope: str) -> Mapping[str, Any] | str | None:
        return None

    async def before_call(self) -> None:
        return None

    async def save_item(
        self, execution: StepExecution, item: int, announce: Callable[[], None]
    ) -> None:
        announce()


def _tool_choice(tools: Sequence[str | ToolLike]) -> tuple[list[str], list[ToolLike]]:
    """The tool names steps may use, and the tool objects among them."""
    builtin = {t.name for t in builtin_tools(http=False)}
    names: list[str] = []
    objects: list[ToolLike] = []
    problems = []
    for item in tools:
        if isinstance(item, str):
            if item not in builtin:
                problems.append(
                    Problem(
                        file="plan",
                        message=f"unknown tool {item!r}; built-in tools: "
                        + ", ".join(sorted(builtin)),
                        field="tools",
                    )
                )
            names.append(item)
        else:
            objects.append(item)
            names.append(getattr(item, "name", getattr(item, "__name__", "")))
    if problems:
        raise PlanError(problems)
    return names, objects


def _workspace_files(workspace: str | Path | None, limit: int = 200) -> list[str] | None:
    """The files of the workspace (relative paths, hidden ones left out), or ``None`` when
    there is none.

    Raises:
        PlanError: the workspace does not exist or is not a folder.
    """
    if workspace is None:
        return None
    root = Path(workspace)
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise PlanError(
            [Problem(file="plan", message=f"the workspace {str(root)!r} {what}", field="workspace")]
        )
    found = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    return found[:limit]
