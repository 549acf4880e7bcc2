"""`PlanResult`: what a planned run did, with its honest token report."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from minions._messages import ModelCall
from minions._plan.plan import Plan, TokenLine
from minions._step.execution import StepExecution, StepStatus
from minions._step.result import AgentResult
from minions._text import estimate_tokens

__all__ = ["PlanResult"]


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """The record of a plan run, replans included.

    Attributes:
        plan: the plan as it finally ran (kept steps and the revised ones).
        status: `StepStatus.COMPLETED` when every step of the final plan completed.
        executions: each step's execution that counts: the completed one, else the last.
        runs: the `AgentResult` of each attempt (one, plus one per replan).
        revisions: every plan the run went through, the first one included.
        tokens: prompt and completion tokens of the planner, each replan and each step
            (a step that failed and ran again has a line per attempt).
        error: why the run failed.
    """

    plan: Plan
    status: StepStatus
    executions: Mapping[str, StepExecution]
    runs: tuple[AgentResult, ...]
    revisions: tuple[Plan, ...]
    tokens: tuple[TokenLine, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the plan's run completed."""
        return self.status is StepStatus.COMPLETED

    @property
    def replans(self) -> int:
        """How many times the planner revised the plan."""
        return len(self.revisions) - 1

    @property
    def artifacts(self) -> dict[str, Any]:
        """Each completed step's artifacts (``text``, ``files``, ``data``), by step id."""
        return {
            step_id: execution.output
            for step_id, execution in self.executions.items()
            if execution.status is StepStatus.COMPLETED
        }

    @property
    def output(self) -> Any:
        """The last run's output."""
        return self.runs[-1].output if self.runs else None

    def total(self, part: Literal["planner", "replan", "step"] | None = None) -> TokenLine:
        """The tokens of every line (or of one part: ``planner``, ``replan``, ``step``)."""
        lines = [line for line in self.tokens if part is None or line.part == part]
        return _sum(lines, name=part or "total")

    def full_history_estimate(self) -> int:
        """About how many prompt tokens the same steps would have sent as one conversation
        with full history: each step's request carrying every earlier step's request and
        answer (an estimate from this run's counts, in the order the steps ran; the planner
        is left out, as full history has none)."""
        carried = total = 0
        for line in self.tokens:
            if line.part != "step":
                continue
            total += carried + line.prompt_tokens
            carried += line.prompt_tokens + line.completion_tokens
        return total

    def token_report(self) -> str:
        """The token report as aligned text: a line per planner call, replan and step."""
        rows = [("part", "prompt", "completion", "calls", "counted", "status")]
        for line in (*self.tokens, self.total()):
            rows.append(
                (
                    line.name,
                    str(line.prompt_tokens),
                    str(line.completion_tokens),
                    str(line.calls),
                    line.source,
                    line.status,
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        table = "\n".join(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows
        )
        return (
            f"{table}\nthe same steps with full history: about "
            f"{self.full_history_estimate()} prompt tokens (estimated)"
        )

    def to_data(self) -> dict[str, Any]:
        """The result as JSON-ready data (what ``minions plan --run --json`` prints)."""
        return {
            "plan": self.plan.model_dump(mode="json"),
            "status": self.status.value,
            "error": self.error,
            "replans": self.replans,
            "steps": {
                step_id: {
                    "status": e.status.value,
                    "error": e.error,
                    "output": e.output,
                }
                for step_id, e in self.executions.items()
            },
            "tokens": [_line_data(line) for line in (*self.tokens, self.total())],
            "full_history_estimate": self.full_history_estimate(),
        }

    def __repr__(self) -> str:
        return (
            f"PlanResult({self.plan.id!r}, status={self.status.name}, "
            f"steps={len(self.executions)}, replans={self.replans})"
        )


def _line_data(line: TokenLine) -> dict[str, Any]:
    return {
        "name": line.name,
        "part": line.part,
        "prompt_tokens": line.prompt_tokens,
        "completion_tokens": line.completion_tokens,
        "calls": line.calls,
        "source": line.source,
        "status": line.status,
    }


def _sum(lines: Iterable[TokenLine], *, name: str) -> TokenLine:
    lines = list(lines)
    sources = {line.source for line in lines if line.calls}
    source: Literal["reported", "estimated", "mixed"] = (
        "mixed" if len(sources) > 1 else (sources.pop() if sources else "reported")
    )
    return TokenLine(
        name=name,
        part="step",
        prompt_tokens=sum(line.prompt_tokens for line in lines),
        completion_tokens=sum(line.completion_tokens for line in lines),
        calls=sum(line.calls for line in lines),
        source=source,
        status="",
    )


def token_line(
    name: str,
    part: Literal["planner", "replan", "step"],
    calls: Iterable[ModelCall],
    *,
    status: str = "completed",
) -> TokenLine:
    """The tokens of some model calls: as the provider reported them, or, for a call it
    did not report, estimated (characters / 4) from the exact messages sent and received."""
    prompt = completion = count = estimated = 0
    for call in calls:
        count += 1
        if call.usage.calls and call.usage.complete:
            prompt += call.usage.prompt_tokens
            completion += call.usage.completion_tokens
            continue
        estimated += 1
        prompt += sum(4 + estimate_tokens(m.content) for m in call.prompt.messages)
        if call.response is not None:
            reply = call.response.text + "".join(
                c.name + json.dumps(dict(c.arguments), default=str)
                for c in call.response.tool_calls
            )
            completion += estimate_tokens(reply) if reply else 0
    source: Literal["reported", "estimated", "mixed"] = (
        "reported" if estimated == 0 else "estimated" if estimated == count else "mixed"
    )
    return TokenLine(
        name=name,
        part=part,
        prompt_tokens=prompt,
        completion_tokens=completion,
        calls=count,
        source=source,
        status=status,
    )
