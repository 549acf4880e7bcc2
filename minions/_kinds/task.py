"""TaskStep: one step of a plan, run with only what it needs.

Its conversation holds its goal, the content of the workspace files it names (read through
the ``read_file`` tool, only those) and the artifacts of its direct dependencies; the model
answers with typed artifacts (text, files with their path, structured data), and the files
are written to the workspace through the ``write_file`` tool.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from minions._messages import Message
from minions._output import OutputInstructions
from minions._step.execution import StepStatus
from minions._step.run import StepRun
from minions._step.step import Step, StepInput
from minions.errors import Problem
from minions.tools._tool import ToolRegistry

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


class _TaskCall(Step):
    """The model call of a task step: fixed messages, artifacts as structured output."""

    kind: ClassVar[str] = "task"

    def __init__(
        self, id: str, messages: Sequence[Message], *, tools: frozenset[str], **options: Any
    ) -> None:
        super().__init__(id, **options)
        self.messages = list(messages)
        self.tools = tools
        self.output = _ARTIFACTS

    def tool_names(self) -> frozenset[str]:
        return self.tools

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return list(self.messages)


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
        **options: Any,
    ) -> None:
        super().__init__(id, **options)
        self.goal = goal
        self.type = type
        self.reads = tuple(reads)
        self.artifacts = tuple(artifacts)
        self.tools = frozenset(tools)

    def tool_names(self) -> frozenset[str]:
        return self.tools | {WRITE_TOOL} | ({READ_TOOL} if self.reads else frozenset())

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
        return found

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return task_messages(self, {}, step_input.dependencies)

    async def run(self, run: StepRun) -> None:
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
        responses = await asyncio.gather(
            *(run.call_tool(READ_TOOL, {"path": path}) for path in missing)
        )
        for path, response in zip(missing, responses, strict=True):
            if response.error is not None:
                run.fail(f"step {self.id!r}: cannot read its input {path!r}: {response.error}")
            files[path] = str(response.result)
        call = _TaskCall(
            self.id,
            task_messages(self, files, run.dependencies),
            tools=self.tools,
            model=self.model,
            config=self.config,
            completion=self.completion,
        )
        done = await run.run_step(call, dependencies={}, scope=f"{run.scope}/call", checked=True)
        run.absorb([done])
        if done.status is not StepStatus.COMPLETED:
            run.fail(done.error or f"step {self.id!r} did not complete")
        try:
            artifacts = Artifacts.model_validate(done.output)
        except ValidationError as exc:
            run.fail(f"step {self.id!r}: its answer is not artifacts: {exc}")
        for file in artifacts.files:
            written = await run.call_tool(WRITE_TOOL, {"path": file.path, "content": file.content})
            if written.error is not None:
                run.fail(f"step {self.id!r}: cannot write {file.path!r}: {written.error}")
        run.complete(artifacts.model_dump(mode="json"))


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
