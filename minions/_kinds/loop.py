"""LoopStep: a step run once per item of a list, outputs collected in item order."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Unpack

from minions._fold import step_error
from minions._messages import Message
from minions._step.execution import StepExecution, StepStatus
from minions._step.run import StepRun
from minions._step.step import Step, StepInput
from minions._templates import render
from minions.errors import Problem, StepDefinitionError
from minions.tools import ToolRegistry

if TYPE_CHECKING:
    from minions._step.step import StepOptions

__all__ = ["LoopStep"]


class LoopStep(Step):
    """Runs a step once per item of a list and collects the outputs in item order.

    Inside the body, templates see ``loop.item`` and ``loop.index``. Items run one by one, or
    up to `parallel` at once. The output is the list of item outputs (``None`` for an item that
    failed); every item's execution is in `StepExecution.items`. An empty list completes with
    an empty output. When an item fails, the loop step fails naming the items, unless
    `continue_on_error` is set.

    Args:
        body: the step to run per item; its id is the loop step's id.
        items: a list, or a template giving one (``"{{ analyse.output.ids }}"``).
        parallel: how many items may run at once.
        continue_on_error: complete even when items failed.
        **options: the `Step` options; `depends_on`, `mode`, `timeout`... of the loop.
    """

    kind: ClassVar[str] = "loop"

    def __init__(
        self,
        body: Step,
        items: Any,
        *,
        parallel: int = 1,
        continue_on_error: bool = False,
        **options: Unpack[StepOptions],
    ) -> None:
        options.setdefault("description", body.description)
        options.setdefault("depends_on", body.depends_on)
        super().__init__(body.id, **options)
        self.body = body
        self.items = items
        self.parallel = parallel
        self.continue_on_error = continue_on_error
        if not isinstance(parallel, int) or parallel < 1:
            raise StepDefinitionError(f"step {body.id!r}: parallel must be at least 1")

    def tool_names(self) -> frozenset[str]:
        return self.body.tool_names()

    def uses_model(self) -> bool:
        # A model the body names is its own; otherwise it calls the one the loop is given.
        return self.body.model is None and self.body.uses_model()

    def templates(self) -> Mapping[str, Any]:
        return {"loop": self.items, **self.body.templates()}

    def problems(self, tools: ToolRegistry | None = None) -> list[Problem]:
        # The body checks the tools; the loop's own checks are its options.
        return [*super().problems(None), *self.body.problems(tools)]

    def build_messages(self, step_input: StepInput) -> list[Message]:
        return []

    async def run(self, run: StepRun) -> None:
        items = render(self.items, run.state)
        if not isinstance(items, list | tuple):
            run.fail(
                f"step {self.id!r}: loop needs a list, but {self.items!r} gave "
                f"{type(items).__name__}"
            )
        limit = asyncio.Semaphore(self.parallel)

        async def run_item(index: int, item: Any) -> StepExecution:
            async with limit:
                state = {**run.state, "loop": {"item": item, "index": index}}
                # Checked with the loop step.
                return await run.run_step(self.body, state=state, item=index, checked=True)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(run_item(i, item)) for i, item in enumerate(items)]
        done = [task.result() for task in tasks]
        run.absorb(done, items=True)
        failed = [r for r in done if r.status is not StepStatus.COMPLETED]
        outputs = [r.output if r.status is StepStatus.COMPLETED else None for r in done]
        if failed and not self.continue_on_error:
            details = "; ".join(
                f"{r.step_id}: {step_error(r.step_id, r.error or '')}" for r in failed[:3]
            )
            more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
            run.fail(
                f"{len(failed)} of {len(done)} loop items failed: {details}{more}", output=outputs
            )
        run.complete(outputs)
