"""Limits per model endpoint within one process: the limits file, requests in flight, requests
and tokens per minute (on a clock of the test's), a 429's pause for every run, the wait as an
event, and a step's timeout counting the wait."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from runs_helpers import overlapping_server

from minions import AgentExecutor, ExecutionConfig
from minions.errors import ConfigError
from minions.events import Event, ModelCallWaiting
from minions.models import EndpointLimit, Limits, LocalLimiter
from minions.recipes import parse_recipe
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

ONE_STEP = "id: ask\nsteps:\n  - {id: ask, goal: say hi}\n"


def limits(url: str, **values: Any) -> Limits:
    return Limits(endpoints=(EndpointLimit(match=url, **values),))


class FakeClock:
    """A clock that moves only when a waiter sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def until(condition: Any, within: float = 20.0) -> None:
    for _ in range(int(within / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


# -- the limits file ---------------------------------------------------------------------------


def test_a_limits_file_loads(tmp_path: Path) -> None:
    file = tmp_path / "limits.yaml"
    file.write_text(
        "endpoints:\n"
        '  - match: "http://127.0.0.1:8080/v1/"\n'
        "    max_concurrent: 2\n"
        "    requests_per_minute: 60\n"
        "    tokens_per_minute: 20000\n"
        '  - {match: "http://gpu:8000/v1#llama", max_concurrent: 1}\n'
        "capability_expiry: 12h\n"
    )
    loaded = Limits.load(file)
    assert loaded.capability_expiry == 12 * 3600
    first, second = loaded.endpoints
    assert (first.match, first.max_concurrent, first.tokens_per_minute) == (
        "http://127.0.0.1:8080/v1",
        2,
        20000,
    )
    assert loaded.rules(("http://127.0.0.1:8080/v1", "any")) == (first,)
    assert loaded.rules(("http://gpu:8000/v1", "llama")) == (second,)
    assert loaded.rules(("http://gpu:8000/v1", "other")) == ()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("endpoints: [{match: 'localhost:8080', max_concurrent: 2}]", "endpoints.0.match"),
        ("endpoints: [{match: 'http://h/v1', max_concurrent: 0}]", "endpoints.0.max_concurrent"),
        ("endpoints: [{match: 'http://h/v1', max_concurent: 2}]", "max_concurent"),
        ("capability_expiry: soon", "capability_expiry"),
        ("endpoints: [", "not valid YAML"),
    ],
)
def test_a_bad_limits_file_is_named_with_its_field(tmp_path: Path, text: str, said: str) -> None:
    file = tmp_path / "limits.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=r"limits\.yaml") as raised:
        Limits.load(file)
    assert said in str(raised.value)


# -- requests in flight ------------------------------------------------------------------------


async def test_max_concurrent_holds_over_the_runs_of_a_process_and_waits_are_events() -> None:
    gate = threading.Event()
    events: list[Event] = []
    async with FakeOpenAIServer(lambda _: FakeReply.text("hi"), gate=gate) as server:
        executor = AgentExecutor(
            model=server.model(),
            limits=limits(server.url, max_concurrent=2),
            listeners=[events.append],
        )
        recipe = parse_recipe(ONE_STEP)
        runs = [asyncio.create_task(executor.execute(recipe)) for _ in range(6)]
        await until(lambda: server.in_flight == 2)
        await until(lambda: sum(isinstance(e, ModelCallWaiting) for e in events) == 4)
        assert server.in_flight == 2  # the four others wait before they are sent
        gate.set()
        results = await asyncio.gather(*runs)
        url = server.url
    assert [r.output for r in results] == ["hi"] * 6
    assert server.max_in_flight == 2
    waiting = [e for e in events if isinstance(e, ModelCallWaiting)]
    assert {(e.reason, e.endpoint, e.model) for e in waiting} == {
        ("max_concurrent", url, "fake:fake-model")
    }


async def test_no_limit_matching_the_endpoint_changes_nothing() -> None:
    gate = threading.Event()
    async with FakeOpenAIServer(lambda _: FakeReply.text("hi"), gate=gate) as server:
        executor = AgentExecutor(
            model=server.model(), limits=limits("http://elsewhere:1/v1", max_concurrent=1)
        )
        recipe = parse_recipe(ONE_STEP)
        runs = [asyncio.create_task(executor.execute(recipe)) for _ in range(3)]
        await until(lambda: server.in_flight == 3)
        gate.set()
        await asyncio.gather(*runs)


async def test_a_step_timeout_counts_the_wait_for_a_slot() -> None:
    async with FakeOpenAIServer(lambda _: FakeReply.text("hi")) as server:
        limiter = LocalLimiter(limits(server.url, max_concurrent=1))
        held = await limiter.acquire((server.url, "fake-model"), tokens=1)  # nobody gives it back
        assert held is not None
        recipe = parse_recipe("id: t\nsteps:\n  - {id: ask, goal: say hi, timeout: 0.2}\n")
        result = await AgentExecutor(model=server.model(), limits=limiter).execute(recipe)
        assert result.step("ask").error == "step 'ask' timed out after 0.2s"
        assert server.chat_requests == []
        limiter.release(held)
        assert limiter.in_flight(server.url) == 0  # the timed-out wait took no slot


# -- requests and tokens per minute -------------------------------------------------------------


async def test_requests_per_minute_hold_over_every_window() -> None:
    clock = FakeClock()
    sent: list[float] = []

    def reply(_: FakeRequest) -> FakeReply:
        sent.append(clock.now)
        return FakeReply.text("hi")

    async with FakeOpenAIServer(reply) as server:
        limiter = LocalLimiter(
            limits(server.url, requests_per_minute=3), clock=clock, sleep=clock.sleep
        )
        executor = AgentExecutor(model=server.model(), limits=limiter)
        recipe = parse_recipe(ONE_STEP)
        # One after the other: the clock moves only while a call waits, never while one is
        # on its way, so the server's times are the limiter's.
        for _ in range(10):
            await executor.execute(recipe)
    assert len(sent) == 10
    for start in sent:
        assert sum(start <= at < start + 60 for at in sent) <= 3
    assert sent[-1] - sent[0] >= 180  # 10 requests at 3 a minute need three more minutes


async def test_tokens_per_minute_count_the_estimate_then_the_usage() -> None:
    clock = FakeClock()
    sent: list[float] = []

    def reply(_: FakeRequest) -> FakeReply:
        sent.append(clock.now)
        return FakeReply.text("hi").with_usage(40, 60)

    async with FakeOpenAIServer(reply) as server:
        limiter = LocalLimiter(
            limits(server.url, tokens_per_minute=200), clock=clock, sleep=clock.sleep
        )
        executor = AgentExecutor(model=server.model(), limits=limiter)
        recipe = parse_recipe(ONE_STEP)
        for _ in range(5):
            await executor.execute(recipe)
    # Each call costs 100 tokens once answered: two fit in any minute, not three.
    for start in sent:
        assert sum(start <= at < start + 60 for at in sent) <= 2
    assert sent[2] - sent[0] >= 60


# -- 429 -----------------------------------------------------------------------------------------


async def test_a_429_with_retry_after_pauses_the_endpoint_for_every_run() -> None:
    clock = FakeClock()
    sent: list[tuple[float, str]] = []
    first = threading.Event()

    def reply(request: FakeRequest) -> FakeReply:
        sent.append((clock.now, str(request.messages[-1].get("content"))))
        if not first.is_set():
            first.set()
            return FakeReply.rate_limit(retry_after=2)
        return FakeReply.text("ok")

    events: list[Event] = []
    others: list[asyncio.Task[Any]] = []
    async with FakeOpenAIServer(reply) as server:
        limiter = LocalLimiter(limits(server.url, max_concurrent=4), clock=clock, sleep=clock.sleep)
        other = AgentExecutor(model=server.model(), limits=limiter, listeners=[events.append])

        def start_another(event: Event) -> None:
            # Once the first run has seen its 429 (it schedules its retry), another starts.
            if event.kind == "retry_scheduled" and not others:
                recipe = parse_recipe("id: other\nsteps:\n  - {id: other, goal: say ho}\n")
                others.append(asyncio.create_task(other.execute(recipe)))

        executor = AgentExecutor(
            model=server.model(),
            limits=limiter,
            config=ExecutionConfig(retry_initial_delay=0.0, retry_max_delay=0.0),
            listeners=[start_another],
        )
        assert (await executor.execute(parse_recipe(ONE_STEP))).output == "ok"
        assert (await others[0]).output == "ok"
    refused_at = sent[0][0]
    (asked_at,) = [at for at, text in sent if "say ho" in text]
    assert asked_at >= refused_at + 2
    assert [e.reason for e in events if isinstance(e, ModelCallWaiting)] == ["retry_after"]


def _http_date(offset: float) -> str:
    import email.utils
    import time

    return email.utils.formatdate(time.time() + offset, usegmt=True)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "30"}, 30.0),
        ({"retry-after": " 2.5 "}, 2.5),
        ({"retry-after": "-5"}, 0.0),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "Infinity"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "1e309"}, None),
        ({"retry-after": "9" * 5000}, None),
        ({"retry-after": "86400000000"}, 86400000000.0),
        ({"retry-after": "soon, please"}, None),
        ({"retry-after": ""}, None),
        ({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, "far"),
        ({"retry-after": "Mon, 01 Jan 1900 00:00:00 GMT"}, 0.0),
        ({"retry-after": "Sun, 99 Foo 2024 99:99:99 GMT"}, None),
        ({"retry-after-ms": "nan", "retry-after": "3"}, 3.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "-inf"}, None),
    ],
)
def test_retry_after_is_read_defensively(headers: dict[str, str], seconds: Any) -> None:
    """A 429's ``Retry-After`` is a finite, non-negative number of seconds or nothing:
    infinite, NaN, garbage and dates no calendar has never reach a pause."""
    from minions.models._openai_wire import retry_after

    found = retry_after(headers)
    if seconds == "far":
        assert found is not None
        assert found > 1e10
    else:
        assert found == seconds


@pytest.mark.parametrize("offset", [3600.0, -3600.0])
def test_retry_after_reads_an_http_date(offset: float) -> None:
    from minions.models._openai_wire import retry_after

    found = retry_after({"retry-after": _http_date(offset)})
    assert found is not None
    assert (3500 < found <= 3600) if offset > 0 else found == 0.0


async def test_a_429_asking_for_a_day_pauses_the_process_for_max_pause_at_most() -> None:
    clock = FakeClock()
    rules = limits("http://127.0.0.1:9/v1", max_concurrent=4).model_copy(update={"max_pause": 60})
    limiter = LocalLimiter(rules, clock=clock, sleep=clock.sleep)
    start = clock.now
    assert limiter.pause(("http://127.0.0.1:9/v1", "m"), 86400.0) == 60.0
    assert limiter.pause(("http://127.0.0.1:9/v1", "m"), float("inf")) == 0.0
    permit = await limiter.acquire(("http://127.0.0.1:9/v1", "m"), tokens=1)
    assert permit is not None
    assert start + 60 <= clock.now < start + 61


# -- minions run --limits ----------------------------------------------------------------------

PARALLEL = """\
id: four
steps:
  - {id: a, goal: say a}
  - {id: b, goal: say b}
  - {id: c, goal: say c}
  - {id: d, goal: say d}
"""


@pytest.mark.parametrize("limited", [True, False])
def test_minions_run_holds_its_limits(tmp_path: Path, limited: bool) -> None:
    from typer.testing import CliRunner

    from minions.cli._app import app

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(PARALLEL)
    with overlapping_server() as server:
        file = tmp_path / "limits.yaml"
        file.write_text(f'endpoints:\n  - {{match: "{server.url}", max_concurrent: 1}}\n')
        args = ["run", str(recipe), "--model", f"openai-compatible:fake-model@{server.url}"]
        result = CliRunner().invoke(app, [*args, *(["--limits", str(file)] if limited else [])])
        assert result.exit_code == 0, result.stderr
        url = server.url
    if limited:
        assert server.max_in_flight == 1
        assert f"waits for {url}: as many calls as allowed are in flight" in result.stderr
    else:  # the same run without limits sends its four steps' calls at once
        assert server.max_in_flight > 1


def test_minions_run_names_a_bad_limits_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from minions.cli._app import app

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(PARALLEL)
    file = tmp_path / "limits.yaml"
    file.write_text("endpoints: [{match: nowhere}]\n")
    result = CliRunner().invoke(app, ["run", str(recipe), "--model", "test", "--limits", str(file)])
    assert result.exit_code == 2
    assert "limits.yaml" in result.stderr
    assert "endpoints.0.match" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["worker", "serve"])
def test_worker_and_serve_name_a_bad_limits_file_before_starting(
    tmp_path: Path, command: str
) -> None:
    from typer.testing import CliRunner

    from minions.cli._app import app

    file = tmp_path / "limits.yaml"
    file.write_text("endpoints: [{match: 'http://h/v1', requests_per_minute: -1}]\n")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    result = CliRunner().invoke(app, [command, "--database-url", url, "--limits", str(file)])
    assert result.exit_code == 2
    assert "endpoints.0.requests_per_minute" in result.stderr
    assert not (tmp_path / "runs.db").exists()  # nothing started
