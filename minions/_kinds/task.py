"""TaskStep: one step of a plan, run with only what it needs.

Its conversation holds its goal, the content of the workspace files it names (read through
the ``read_file`` tool, only those) and the artifacts of its direct dependencies; the model
answers with typed artifacts (text, files with their path, structured data), and the files
are written to the workspace through the ``write_file`` tool.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Unpack, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from minions._messages import Message, ToolCall
from minions._output import OutputInstructions
from minions._step.completion import CompletionDecision, StepCompletionChain, StructuredOutputLink
from minions._step.context import AgentContext
from minions._step.execution import StepExecution, StepStatus
from minions._step.run import StepRun
from minions._step.step import Step, StepInput
from minions._step.tool_call import ToolCallExecutor
from minions.errors import Problem
from minions.tools import ToolRegistry

if TYPE_CHECKING:
    from minions._step.step import StepOptions

__all__ = ["TaskStep"]

TaskType = Literal["analyze", "generate", "modify", "validate", "cleanup"]
"""What a step of a plan does."""

READ_TOOL = "read_file"
WRITE_TOOL = "write_file"

TASK_SYSTEM = (
    "You carry out one step of a larger plan. Work only from what you are given, and answer "
    "with JSON only."
)
"""A task step's system prompt."""


class FileArtifact(BaseModel):
    """A file a step wrote: its path in the workspace and its whole content."""

    model_config = ConfigDict(extra="ignore")

    path: str = Field(description="The file's path inside the workspace.")
    content: str = Field(description="The whole content of the file.")


class Artifacts(BaseModel):
    """What a step of a plan produced: text, files (written to the workspace) and data."""

    model_config = ConfigDict(extra="ignore")

    text: str = Field("", description="Findings, decisions or a short summary, as text.")
    files: list[FileArtifact] = Field(
        default_factory=list, description="Files to write, each whole, with its path."
    )
    data: dict[str, Any] = Field(
        default_factory=dict, description="Structured results later steps can use."
    )


_STRING = {"type": "string"}
ARTIFACTS_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "text": _STRING,
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"path": _STRING, "content": _STRING},
                "required": ["path", "content"],
            },
        },
        "data": {"type": "object"},
    },
    "required": ["text"],
}
"""The schema the model answers in: `Artifacts`, kept small (it may be sent with every
request); the answer is then validated as `Artifacts`."""

_ARTIFACTS = OutputInstructions(ARTIFACTS_SCHEMA, name="artifacts")

_STAGED: ContextVar[Mapping[str, str] | None] = ContextVar("minions_staged_files", default=None)


@contextmanager
def staged_files(files: Mapping[str, str] | None) -> Iterator[None]:
    """Task steps run inside this block take these workspace files' content as read already.

    A plan runner reads the inputs that exist before the run (and that no step of the plan
    produces) once, up front and at the same time, instead of each step reading its own
    when its dependencies are done.
    """
    token = _STAGED.set(files)
    try:
        yield
    finally:
        _STAGED.reset(token)


_FILES: ContextVar[Mapping[str, str | None] | None] = ContextVar("minions_task_files", default=None)
"""The files of the task step running in this task (each step runs in a task of its own)."""


class TaskStep(Step):
    """One step of a plan: a goal, the files it reads, the artifacts it produces.

    The model sees the goal, the files named in `reads` and the artifacts of the steps in
    `depends_on`, nothing else; it answers with `Artifacts` (through the structured-output
    ladder), whose files are written to the workspace. The output is the artifacts as a dict
    (``text``, ``files``, ``data``). The goal is used as written: it is not a template.

    Args:
        id: the step id.
        goal: what the step must do.
        type: ``analyze``, ``generate``, ``modify``, ``validate`` or ``cleanup``.
        reads: workspace files whose content the step needs.
        artifacts: what the step will produce (file paths, or names of results).
        tools: tools the model may call while working (besides the file reads and writes
            the step does itself).
        **options: the `Step` options (`depends_on`, `model`, `config`...).
    """

    kind: ClassVar[str] = "task"

    def __init__(
        self,
        id: str,
        goal: str,
        *,
        type: TaskType = "generate",
        reads: Iterable[str] = (),
        artifacts: Iterable[str] = (),
        tools: Iterable[str] = (),
        **options: Unpack[StepOptions],
    ) -> None:
        super().__init__(id, **options)
        self.goal = goal
        self.type = type
        self.reads = tuple(reads)
        self.artifacts = tuple(artifacts)
        self.tools = frozenset(tools)
        self.output = _ARTIFACTS

    def completion_chain(self, default: StepCompletionChain) -> StepCompletionChain:
        """`default` (or the step's own chain), with its structured-output link checking that
        the answer holds every file the step said it will produce."""
        chain = super().completion_chain(default)
        return chain.replace("structured_output", _ArtifactsCheck())

    def promised_files(self) -> tuple[str, ...]:
        """The `artifacts` that are files (a path with a folder or a suffix, ``app/user.py``),
        not names of results (``analysis``)."""
        return tuple(a for a in self.artifacts if "/" in a or PurePosixPath(a).suffix)

    def tool_names(self) -> frozenset[str]:
        """The tools the model may call: the step's own `tools` only. The step reads its
        inputs and writes its files itself, through the workspace file tools."""
        return self.tools

    def problems(self, tools: ToolRegistry | None = None) -> list[Problem]:
        found = super().problems(tools)
        if not isinstance(self.goal, str) or not self.goal.strip():
            found.append(Problem(message="goal is empty", step=self.id, field="goal"))
        if self.type not in get_args(TaskType):
            found.append(
                Problem(
                    message=f"type must be one of {', '.join(get_args(TaskType))}, "
                    f"not {self.type!r}",
                    step=self.id,
                    field="type",
                )
            )
        for path in self.reads:
            if not isinstance(path, str) or not path.strip():
                found.append(Problem(message="an input path is empty", step=self.id, field="reads"))
        if tools is not None:
            for name in (READ_TOOL, WRITE_TOOL) if self.reads else (WRITE_TOOL,):
                if tools.get(name) is None:
                    found.append(
                        Problem(
                            message=f"a task step needs the {name!r} tool (the built-in file "
                            "tools of the workspace)",
                            step=self.id,
                            field="tools",
                        )
                    )
        return found

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return task_messages(self, _FILES.get() or {}, step_input.dependencies)

    async def run(self, run: StepRun) -> None:
        files_tools = ToolCallExecutor(
            run.context.tools.subset(
                [n for n in (READ_TOOL, WRITE_TOOL) if n in run.context.tools]
            ),
            config=run.execution.config or run.context.config,
            emitter=run.context.events,
            step_id=run.name,
            scope=run.scope,
            approver=run.context.settings.approver,
            visit=run.visit,
            item=run.item,
        )

        async def call(name: str, number: int, arguments: Mapping[str, Any]) -> ToolCall:
            asked = ToolCall(id=f"{run.name}-{name}-{number}", name=name, arguments=arguments)
            done = await files_tools.execute(asked)
            run.absorb([StepExecution(step_id=run.name, tool_calls=[done])])
            return done

        # A file a dependency just wrote is taken from its artifacts; one read up front by
        # the plan's runner from what it read; any other is read now, all at once.
        produced = {
            str(file["path"]): str(file["content"])
            for output in run.dependencies.values()
            if isinstance(output, Mapping)
            for file in output.get("files") or ()
        }
        staged = _STAGED.get() or {}
        files = {p: produced[p] if p in produced else staged.get(p) for p in self.reads}
        missing = [p for p, content in files.items() if content is None]
        reads = await asyncio.gather(
            *(call(READ_TOOL, i, {"path": p}) for i, p in enumerate(missing, start=1))
        )
        for path, done in zip(missing, reads, strict=True):
            assert done.response is not None  # `ToolCallExecutor.execute` always sets it
            if done.response.error is not None:
                run.fail(f"step {self.id!r}: cannot read its input {path!r}: {done.response.error}")
            files[path] = str(done.response.result)
        token = _FILES.set(files)
        try:
            await run.run_model_loop()
        finally:
            _FILES.reset(token)
        if run.execution.status is not StepStatus.COMPLETED:
            return
        try:
            artifacts = Artifacts.model_validate(run.execution.output)
        except ValidationError as exc:
            run.fail(f"step {self.id!r}: its answer is not artifacts: {exc}")
        for number, file in enumerate(artifacts.files, start=1):
            done = await call(WRITE_TOOL, number, {"path": file.path, "content": file.content})
            assert done.response is not None
            if done.response.error is not None:
                run.fail(f"step {self.id!r}: cannot write {file.path!r}: {done.response.error}")
        run.complete(artifacts.model_dump(mode="json"))


class _ArtifactsCheck(StructuredOutputLink):
    """A task step's answer holds the files it promised, or it is asked again naming them (a
    step that still leaves one out fails, and a plan runner replans)."""

    name = "structured_output"

    def check(self, execution: StepExecution, context: AgentContext) -> CompletionDecision | None:
        decision = super().check(execution, context)
        step = execution.step
        if decision is None or decision.kind != "complete" or not isinstance(step, TaskStep):
            return decision
        output = decision.output
        given = {
            str(f.get("path", "")).strip().lstrip("./")
            for f in (output.get("files") or [] if isinstance(output, Mapping) else [])
            if isinstance(f, Mapping)
        }
        missing = [p for p in step.promised_files() if p.strip().lstrip("./") not in given]
        if missing:
            return CompletionDecision.reask(
                f"Your answer has no file {', '.join(map(repr, missing))}: give each whole in "
                '"files", with its "path" and "content".'
            )
        return decision


def task_messages(
    step: TaskStep, files: Mapping[str, str | None], dependencies: Mapping[str, Any]
) -> list[Message]:
    """The conversation a task step starts with: its goal, its files, its dependencies'
    artifacts and what to produce; nothing else, and nothing twice."""
    parts = [f"Step ({step.type}): {step.goal.strip()}"]
    for path, content in files.items():
        parts.append(f"File {path}:\n```\n{(content or '').rstrip()}\n```")
    for step_id, output in dependencies.items():
        parts.append(artifacts_text(step_id, output, shown=files.keys()))
    if step.artifacts:
        parts.append(f"Produce: {', '.join(step.artifacts)}.")
    return [Message.system(TASK_SYSTEM), Message.user("\n\n".join(parts))]


def artifacts_text(step_id: str, output: Any, *, shown: Iterable[str] = ()) -> str:
    """A dependency's artifacts as prompt text: its text, its files (but those `shown`
    already), its data."""
    if output is None:
        return f"From step {step_id}: (no result: it did not succeed)"
    if not isinstance(output, Mapping):
        return f"From step {step_id}:\n{output}"
    lines = [f"From step {step_id}:"]
    text = str(output.get("text") or "").strip()
    if text:
        lines.append(text)
    skip = set(shown)
    for file in output.get("files") or ():
        if file["path"] in skip:
            lines.append(f"(wrote {file['path']}, shown above)")
            continue
        lines.append(f"File {file['path']}:\n```\n{str(file['content']).rstrip()}\n```")
    data = output.get("data")
    if data:
        lines.append("Data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return "\n".join(lines)
