"""A step that waits at a call for a person's decision, kept so that it goes on at that call.

A durable run parks while a call waits for a decision (`minions.runs`): its execution ends
there, and a decision queues it again. The step that waited keeps what it needs to go on at
the call (`StepState`: its conversation up to the answer that asked for the call, the turn,
the results of the other calls of that turn already made, its model calls, tool calls,
decisions and usage so far), stored with the park; when the run goes on, the step starts from
it: no model call is made again for the turns before, the calls of that turn that were made
are not made again, and the waiting call finds its decision.

Only the steps of a run that parks pay for it (`ParkingToolCalls`, chosen when the step is
made, for durable steps with a tool that needs approval); every other step runs the plain
`ToolCallExecutor` and `ModelCallExecutor`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from minions._messages import (
    Message,
    ModelCall,
    ModelCallResponse,
    Prompt,
    ToolCall,
    ToolCallResponse,
    Usage,
)
from minions._step.execution import DecisionRecord
from minions._step.model_call import ModelCallExecutor
from minions._step.tool_call import ToolCallExecutor
from minions._text import jsonable
from minions.tools import ApprovalDecision

if TYPE_CHECKING:
    from minions._output import OutputInstructions

__all__: list[str] = []

Capture = Callable[[], Awaitable["StepState | str | None"]]
"""What a parking run asks while a call waits: the state of the step at the call (wait for
the other calls of its turn that are running first), a reason why the step will start again
from its start instead, or None when there is nothing to keep (a call made outside the
model loop, as a tool step's: the step runs again and the call finds its decision)."""

WAITING: ContextVar[Capture | None] = ContextVar("WAITING", default=None)
"""Set while a call of a parking step asks its approver (`ParkingToolCalls`): what the
approver of a durable run asks before it parks the run."""

_NO_PROMPT = Prompt(messages=())
"""The prompt of a model call kept in a `StepState` (prompts are not kept: the conversation
is, once, and the run's log has every request)."""


@dataclass(frozen=True, kw_only=True)
class StepState:
    """What a step that waits at call `call_id` keeps to go on there."""

    scope: str
    """The step execution (``step#visit``, ``step#visit[item]``...)."""
    call_id: str
    """The waiting call, as its approval names it (``scope/id``)."""
    messages: tuple[Message, ...]
    """The conversation before the answer that asked for the call (with the re-ask note of
    its turn, when there was one)."""
    base: int
    """Messages of `messages` at the start of the turn (before its re-ask note)."""
    turn: int
    reasks: int
    """Re-asks of the turn before its answer."""
    done: tuple[ToolCall | None, ...]
    """Each call of the answer, in its order: its result when it was made, else None."""
    model_calls: tuple[ModelCall, ...]
    """Every model call of the step so far (without prompts); the last answer is the turn's."""
    tool_calls: tuple[ToolCall, ...]
    """The tool calls of the turns before."""
    decisions: tuple[DecisionRecord, ...]
    usage: Usage

    @property
    def answer(self) -> ModelCallResponse:
        """The answer that asked for the waiting call."""
        for call in reversed(self.model_calls):
            if call.response is not None:
                return call.response
        raise ValueError("no model call with an answer")

    def to_data(self) -> dict[str, Any]:
        """The state as JSON data (`from_data` reads it)."""
        from minions.models._internal import encode_response

        return {
            "scope": self.scope,
            "call_id": self.call_id,
            "messages": [_message(m) for m in self.messages],
            "base": self.base,
            "turn": self.turn,
            "reasks": self.reasks,
            "done": [None if c is None else _tool_call(c) for c in self.done],
            "model_calls": [
                {
                    "turn": c.turn,
                    "attempt": c.attempt,
                    "response": None if c.response is None else encode_response(c.response),
                    "error": c.error,
                    "usage": asdict(c.usage),
                    "output_mode": c.output_mode,
                    "model": c.model,
                    "endpoint": c.endpoint,
                    "started_at": c.started_at,
                    "duration": c.duration,
                }
                for c in self.model_calls
            ],
            "tool_calls": [_tool_call(c) for c in self.tool_calls],
            "decisions": [asdict(d) for d in self.decisions],
            "usage": asdict(self.usage),
        }

    @classmethod
    def from_data(
        cls, data: Mapping[str, Any], *, step_id: str, output: OutputInstructions | None = None
    ) -> StepState:
        """A state stored by `to_data` (`step_id`: the execution's name, for its model calls;
        `output`: the step's, which a kept structured answer is validated against again).

        Raises:
            KeyError, TypeError, ValueError: the data is not a state (damaged).
        """
        from minions.models._internal import decode_response

        prompt = Prompt(messages=(), output=output)
        state = cls(
            scope=str(data["scope"]),
            call_id=str(data["call_id"]),
            messages=tuple(_message_of(m) for m in data["messages"]),
            base=int(data["base"]),
            turn=int(data["turn"]),
            reasks=int(data["reasks"]),
            done=tuple(None if c is None else _tool_call_of(c) for c in data["done"]),
            model_calls=tuple(
                ModelCall(
                    step_id=step_id,
                    turn=int(c["turn"]),
                    attempt=int(c["attempt"]),
                    prompt=_NO_PROMPT,
                    response=(
                        None if c["response"] is None else decode_response(c["response"], prompt)
                    ),
                    error=c["error"],
                    usage=Usage(**c["usage"]),
                    output_mode=c["output_mode"],
                    model=str(c["model"]),
                    endpoint=c["endpoint"],
                    started_at=float(c["started_at"]),
                    duration=float(c["duration"]),
                )
                for c in data["model_calls"]
            ),
            tool_calls=tuple(_tool_call_of(c) for c in data["tool_calls"]),
            decisions=tuple(DecisionRecord(**d) for d in data["decisions"]),
            usage=Usage(**data["usage"]),
        )
        answer = state.answer
        if len(answer.tool_calls) != len(state.done) or not 0 <= state.base <= len(state.messages):
            raise ValueError("the kept answer does not match the kept calls")
        return state


def _message(message: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": jsonable(dict(c.arguments))}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        data["name"] = message.name
    return data


def _message_of(data: Mapping[str, Any]) -> Message:
    return Message(
        role=data["role"],
        content=str(data["content"]),
        tool_calls=tuple(
            ToolCall(id=str(c["id"]), name=str(c["name"]), arguments=dict(c["arguments"]))
            for c in data.get("tool_calls", ())
        ),
        tool_call_id=data.get("tool_call_id"),
        name=data.get("name"),
    )


def _tool_call(call: ToolCall) -> dict[str, Any]:
    response = call.response
    return {
        "id": call.id,
        "name": call.name,
        "arguments": jsonable(dict(call.arguments)),
        "response": None
        if response is None
        else {
            "result": jsonable(response.result),
            "error": response.error,
            "content": response.content,
            "attempts": response.attempts,
            "duration": response.duration,
        },
    }


def _tool_call_of(data: Mapping[str, Any]) -> ToolCall:
    call_id, name = str(data["id"]), str(data["name"])
    found = data["response"]
    return ToolCall(
        id=call_id,
        name=name,
        arguments=dict(data["arguments"]),
        response=None
        if found is None
        else ToolCallResponse(
            call_id=call_id,
            name=name,
            result=found["result"],
            error=found["error"],
            content=str(found["content"]),
            attempts=int(found["attempts"]),
            duration=float(found["duration"]),
        ),
    )


class ParkingToolCalls(ToolCallExecutor):
    """The tool calls of a step whose run parks while a call waits for a decision: while a
    call waits, its approver can ask for the step's state (`WAITING`), once the other calls
    of the turn that run (not those that wait too) are done; a step that goes on at a call
    gets the calls of that turn that were made back, without making them again."""

    capture: (
        Callable[[ToolCall, Mapping[int, tuple[ToolCall, ToolCall]]], StepState | str | None] | None
    ) = None
    """The step's state at a call, given the calls made (`made`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.made: dict[int, tuple[ToolCall, ToolCall]] = {}
        """The calls made: by the id of the `ToolCall` asked for, that call (kept alive, so
        that its id names no other) and what it gave."""
        self.kept: dict[int, tuple[ToolCall, ToolCall]] = {}
        """The calls of the turn a step goes on at that were made before its run parked
        (same form)."""
        self._running = 0
        """Calls running that do not wait for a decision."""
        self._idle: asyncio.Event | None = None

    async def execute(self, call: ToolCall) -> ToolCall:
        kept = self.kept.pop(id(call), None)
        if kept is not None:
            return kept[1]  # made before the run parked: its result, nothing said again
        self._running += 1
        try:
            done = await super().execute(call)
            self.made[id(call)] = (call, done)
            return done
        finally:
            self._left()

    def _left(self) -> None:
        self._running -= 1
        if not self._running and self._idle is not None:
            self._idle.set()

    async def _approval(self, call: ToolCall, arguments: dict[str, Any]) -> ApprovalDecision:
        self._left()  # waiting is not running: a call that parks does not wait for it

        async def capture() -> StepState | str | None:
            while self._running:
                if self._idle is None or self._idle.is_set():
                    self._idle = asyncio.Event()
                await self._idle.wait()
            return None if self.capture is None else self.capture(call, self.made)

        token = WAITING.set(capture)
        try:
            return await super()._approval(call, arguments)
        finally:
            WAITING.reset(token)
            self._running += 1


class ResumedCalls:
    """The model calls of a step that goes on at a call: the turn it waited in is answered
    by the answer kept (no request is made again), every later one by `calls`."""

    def __init__(self, calls: ModelCallExecutor, state: StepState) -> None:
        self.calls = calls
        self._turn = state.turn
        self._answer: ModelCallResponse | None = state.answer
        # A re-ask of that turn numbers its attempt after the ones made before the park.
        calls._attempts[state.turn] = sum(1 for c in state.model_calls if c.turn == state.turn)

    async def call(self, prompt: Prompt, *, turn: int) -> ModelCallResponse:
        answer = self._answer
        if answer is not None and turn == self._turn:
            self._answer = None
            return answer
        return await self.calls.call(prompt, turn=turn)

    def reasked(self) -> None:
        self.calls.reasked()


def waiting_calls(messages: Sequence[Message]) -> tuple[ToolCall, ...]:
    """The calls of the newest answer of a conversation that waits for their results (the
    answer is its last message), or none."""
    if not messages:
        return ()
    last = messages[-1]
    return last.tool_calls if last.role == "assistant" else ()
