"""W4 — structured output: what one structured-output call costs over the same call with text.

A pydantic model with 10 fields (int, str, str, int, float, bool, list[str], str, str, optional
str). One call is one `StepExecutor.execute()` of a one-turn step in a fresh `AgentContext`:
the structured step must end with a validated instance, the text step with ``"ok"``. The two
run interleaved, call by call; one repetition is 200 calls of each; 1 warm-up, 7 timed.
``structured_overhead_us`` = structured minus text per call, paired per repetition.

Variants:

* ``ScriptedModel`` (headline): the core path. The scripted model answers at once with the
  fixed JSON text; the step loop's `StructuredOutputLink` validates it into the model.
* ``ScriptedModel, provider-validated output``: the scripted answer carries the instance
  already validated (``ModelCallResponse.output``), as `OpenAIChatModel` hands it over; what is
  left is the core's bookkeeping.
* ``OpenAIChatModel+FakeOpenAIServer (MODE)``: the provider path, with the real `openai`
  client over HTTP to a local `FakeOpenAIServer`, one variant per rung of the ladder
  (``json_schema``, ``tool``, ``prompted_json``). The HTTP round trip is on both sides of the
  difference; what remains is shaping the request (schema in it), the `openai` client's
  handling of the larger request and answer, the server's share (it runs in the same
  process), and `OutputInstructions` validating the answer. Each line's
  ``extra.shape_and_parse_us`` is minions' own part of that, measured without HTTP.

    python benchmarks/w4_structured_output.py     # or: python benchmarks/run.py W4

With ``MINIONS_BENCH_QUICK=1`` (as `compare.py` runs it) only the two ``ScriptedModel`` variants
run.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _common import emit, fail, mark_imported, summary
from pydantic import BaseModel

from minions import (
    AgentContext,
    DefaultStep,
    Message,
    Model,
    ModelCallResponse,
    OutputInstructions,
    StepExecutor,
    StepStatus,
    Usage,
)
from minions.models import OutputMode
from minions.testing import Reply, ScriptedModel

mark_imported()

CALLS = 200
WARMUPS = 1
REPETITIONS = 7

Call = Callable[[], Awaitable[None]]


class Book(BaseModel):
    id: int
    title: str
    author: str
    pages: int
    rating: float
    in_print: bool
    tags: list[str]
    language: str
    publisher: str
    subtitle: str | None = None


BOOK = Book(
    id=1,
    title="The Left Hand of Darkness",
    author="Ursula K. Le Guin",
    pages=304,
    rating=4.6,
    in_print=True,
    tags=["science fiction", "classic"],
    language="en",
    publisher="Ace Books",
    subtitle=None,
)
BOOK_JSON = BOOK.model_dump_json()
VALIDATED = ModelCallResponse(
    message=Message.assistant(BOOK_JSON),
    usage=Usage.of_call(30, 60),
    output=BOOK,
    output_mode="json_schema",
)

STRUCTURED_STEP = DefaultStep("book", "Describe the book.", output=OutputInstructions(Book))
TEXT_STEP = DefaultStep("book", "Describe the book.")


def step_call(step: DefaultStep, model: Model, expected: Any) -> Call:
    """One checked call: the step in a fresh context must end with `expected`."""

    async def call() -> None:
        execution = await StepExecutor(step, AgentContext(model=model)).execute()
        if execution.status is not StepStatus.COMPLETED or execution.output != expected:
            fail(f"W4: step ended {execution.status} with {execution.output!r}: {execution.error}")

    return call


def scripted(step: DefaultStep, reply: Reply, expected: Any) -> Callable[[], Call]:
    """A fresh `ScriptedModel` holding one repetition's replies (made outside the timing)."""
    return lambda: step_call(step, ScriptedModel([reply] * CALLS), expected)


def same(call: Call) -> Callable[[], Call]:
    """The same call for every repetition (the model keeps no script)."""
    return lambda: call


async def paired(
    structured: Callable[[], Call], text: Callable[[], Call]
) -> tuple[list[float], list[float], list[float]]:
    """Per-call microseconds (structured minus text, structured, text) per timed repetition."""
    overheads, structured_us, text_us = [], [], []
    for repetition in range(WARMUPS + REPETITIONS):
        structured_call, text_call = structured(), text()
        gc.collect()
        total_structured = total_text = 0.0
        for _ in range(CALLS):
            t0 = time.perf_counter()
            await structured_call()
            t1 = time.perf_counter()
            await text_call()
            t2 = time.perf_counter()
            total_structured += t1 - t0
            total_text += t2 - t1
        if repetition >= WARMUPS:
            structured_us.append(total_structured / CALLS * 1e6)
            text_us.append(total_text / CALLS * 1e6)
            overheads.append(structured_us[-1] - text_us[-1])
    return overheads, structured_us, text_us


def report(variant: str, results: tuple[list[float], ...], *, headline: bool, **extra: Any) -> None:
    overheads, structured_us, text_us = results
    emit(
        "W4",
        variant,
        primary="structured_overhead_us",
        headline=headline,
        metrics={"structured_overhead_us": summary(overheads, "us")},
        extra={
            "calls_per_repetition": CALLS,
            "structured_us_per_call": summary(structured_us, "us"),
            "text_us_per_call": summary(text_us, "us"),
            **extra,
        },
    )


async def core_path() -> None:
    text = scripted(TEXT_STEP, "ok", "ok")
    results = await paired(scripted(STRUCTURED_STEP, BOOK_JSON, BOOK), text)
    report(
        "ScriptedModel",
        results,
        headline=True,
        target_us=40,
        note="JSON text validated by the step loop's StructuredOutputLink",
    )
    results = await paired(scripted(STRUCTURED_STEP, VALIDATED, BOOK), text)
    report(
        "ScriptedModel, provider-validated output",
        results,
        headline=False,
        note="the reply carries the validated instance, as OpenAIChatModel hands it over",
    )


def shape_and_parse_us(mode: OutputMode) -> float:
    """Microseconds minions itself spends per structured call in `mode`, without HTTP: shaping
    the request and reading the validated output from a prebuilt completion (median of 7
    runs of 1,000)."""
    import statistics

    from openai.types.chat import ChatCompletion

    from minions.models._openai_wire import message_of, usage_of
    from minions.models._structured import read_output, shape_request

    output = OutputInstructions(Book)
    request = {"model": "m", "messages": [{"role": "user", "content": "Describe the book."}]}
    reply: dict[str, Any] = {"role": "assistant", "content": BOOK_JSON}
    if mode == "tool":
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "Book", "arguments": BOOK_JSON},
        }
        reply = {"role": "assistant", "content": None, "tool_calls": [call]}
    completion = ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": reply}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 60, "total_tokens": 90},
        }
    )

    def once() -> None:
        shape_request(request, output, mode, with_tools=False)
        message = message_of(completion, usage_of(completion), mode)
        if read_output(message, output, mode)[0] != BOOK:
            fail(f"W4: {mode} did not read the book back")

    runs = []
    for _ in range(8):
        gc.collect()
        started = time.perf_counter()
        for _ in range(1000):
            once()
        runs.append((time.perf_counter() - started) / 1000 * 1e6)
    return round(statistics.median(runs[1:]), 3)


async def provider_path() -> None:
    from minions.models._structured import LADDER
    from minions.testing import FakeOpenAIServer, FakeReply

    structured_reply = FakeReply.structured(BOOK)
    async with (
        FakeOpenAIServer(lambda request: structured_reply) as structured_server,
        FakeOpenAIServer(lambda request: "ok") as text_server,
    ):
        text_model = text_server.model()
        for mode in LADDER:
            model = structured_server.model(output_modes=(mode,))
            results = await paired(
                same(step_call(STRUCTURED_STEP, model, BOOK)),
                same(step_call(TEXT_STEP, text_model, "ok")),
            )
            report(
                f"OpenAIChatModel+FakeOpenAIServer ({mode})",
                results,
                headline=False,
                shape_and_parse_us=shape_and_parse_us(mode),
                note="real HTTP on 127.0.0.1 with the openai client and the server in the same "
                "process; shape_and_parse_us is minions' own share (request shaping, reading "
                "and validating the answer), without HTTP",
            )
            await model.aclose()
        await text_model.aclose()


def main() -> None:
    asyncio.run(core_path())
    if not os.environ.get("MINIONS_BENCH_QUICK"):  # set by compare.py
        asyncio.run(provider_path())


if __name__ == "__main__":
    main()
