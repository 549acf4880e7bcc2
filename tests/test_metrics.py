"""The OpenTelemetry metrics of runs (`AgentExecutor(meter_provider=...)`): what a run, its
steps and its model calls record, with bounded labels, to a provider the application gives
(never a global one); and nothing at all without one."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from runs_helpers import until

from minions import AgentExecutor
from minions._tracing import metrics as metrics_module
from minions.events import Event, ModelCallWaiting
from minions.models import EndpointLimit, Limits, LocalLimiter
from minions.recipes import parse_recipe
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

ONE_STEP = "id: ask\nsteps:\n  - {id: ask, goal: say hi}\n"


class Measured:
    """What an in-memory reader holds: ``points(name)`` gives each point's attributes and
    value (a histogram's: its count and sum)."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])

    def _metrics(self) -> Iterator[Any]:
        data = self.reader.get_metrics_data()
        if data is None:
            return
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                yield from scope.metrics

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        found: dict[tuple[tuple[str, Any], ...], Any] = {}
        for metric in self._metrics():
            if metric.name != name:
                continue
            for point in metric.data.data_points:
                key = tuple(sorted(point.attributes.items()))
                value = getattr(point, "value", None)
                found[key] = value if value is not None else (point.count, point.sum)
        return found

    def names(self) -> set[str]:
        return {metric.name for metric in self._metrics()}


def labels(**values: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(values.items()))


async def test_a_run_records_its_run_step_calls_tokens_and_genai_metrics() -> None:
    measured = Measured()
    replies = [FakeReply.failure(503, "busy"), FakeReply.text("hi")]

    def reply(_: FakeRequest) -> FakeReply:
        return replies.pop(0)

    async with FakeOpenAIServer(reply) as server:
        executor = AgentExecutor(model=server.model(), meter_provider=measured.provider)
        result = await executor.execute(parse_recipe(ONE_STEP))
        url, port = server.url, int(server.url.rsplit(":", 1)[1].split("/")[0])
    assert result.ok
    assert measured.points("minions.runs") == {labels(recipe="ask", status="completed"): 1}
    [(count, _)] = measured.points("minions.run.duration").values()
    assert count == 1
    assert list(measured.points("minions.step.duration")) == [labels(recipe="ask", step="ask")]
    assert measured.points("minions.step.wait") == {labels(recipe="ask", step="ask"): (1, 0.0)}
    assert measured.points("minions.model_calls.in_flight") == {labels(endpoint=url): 0}
    assert measured.points("minions.model_call.retries") == {
        labels(endpoint=url, reason="server_error"): 1
    }
    tokens = measured.points("minions.tokens")
    assert set(tokens) == {
        labels(recipe="ask", model="fake:fake-model", kind="input"),
        labels(recipe="ask", model="fake:fake-model", kind="output"),
    }
    assert all(value > 0 for value in tokens.values())
    chat = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "fake",
        "gen_ai.request.model": "fake-model",
        "server.address": "127.0.0.1",
        "server.port": port,
    }
    durations = measured.points("gen_ai.client.operation.duration")
    assert set(durations) == {
        labels(**chat, **{"error.type": "503"}),
        labels(**chat, **{"gen_ai.response.model": "fake-model"}),
    }
    usage = measured.points("gen_ai.client.token.usage")
    assert {dict(key)["gen_ai.token.type"] for key in usage} == {"input", "output"}


async def test_calls_waiting_for_their_endpoint_are_counted_while_they_wait() -> None:
    measured = Measured()
    events: list[Event] = []
    async with FakeOpenAIServer(lambda _: FakeReply.text("hi")) as server:
        limiter = LocalLimiter(
            Limits(endpoints=(EndpointLimit(match=server.url, max_concurrent=1),))
        )
        held = await limiter.acquire((server.url, "fake-model"), tokens=1)
        assert held is not None
        executor = AgentExecutor(
            model=server.model(),
            limits=limiter,
            meter_provider=measured.provider,
            listeners=[events.append],
        )
        runs = [asyncio.create_task(executor.execute(parse_recipe(ONE_STEP))) for _ in range(3)]
        await until(lambda: sum(isinstance(e, ModelCallWaiting) for e in events) == 3)
        assert measured.points("minions.model_call.waiters") == {labels(endpoint=server.url): 3}
        limiter.release(held)
        await asyncio.gather(*runs)
        url = server.url
    assert measured.points("minions.model_call.waiters") == {labels(endpoint=url): 0}
    [(count, waited)] = measured.points("minions.step.wait").values()
    assert count == 3
    assert waited > 0


async def test_an_inner_recipe_run_is_not_a_run_of_its_own(tmp_path: Any) -> None:
    measured = Measured()
    (tmp_path / "inner.yaml").write_text("id: inner\nsteps:\n  - {id: hello, goal: say hi}\n")
    outer = tmp_path / "outer.yaml"
    outer.write_text("id: outer\nsteps:\n  - {id: sub, recipe: inner.yaml}\n")
    from minions.recipes import load_recipe

    async with FakeOpenAIServer(lambda _: FakeReply.text("hi")) as server:
        executor = AgentExecutor(model=server.model(), meter_provider=measured.provider)
        result = await executor.execute(load_recipe(outer))
    assert result.ok
    assert measured.points("minions.runs") == {labels(recipe="outer", status="completed"): 1}


def test_labels_past_their_limit_are_counted_as_other(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(metrics_module.LABEL_LIMITS, "recipe", 2)
    measured = Measured()
    recorded = metrics_module.RunMetrics(measured.provider)
    for recipe in ("a", "b", "c", "d"):
        recorded.run_ended(recipe, "completed", duration=1.0, waited=0.0)
    assert measured.points("minions.runs") == {
        labels(recipe="a", status="completed"): 1,
        labels(recipe="b", status="completed"): 1,
        labels(recipe="_other", status="completed"): 2,
    }


async def test_without_a_meter_provider_nothing_is_measured_and_no_global_is_set() -> None:
    before = otel_metrics.get_meter_provider()
    measured = Measured()
    async with FakeOpenAIServer(lambda _: FakeReply.text("hi")) as server:
        executor = AgentExecutor(model=server.model())
        assert executor.settings.metrics is None
        await executor.execute(parse_recipe(ONE_STEP))
        await AgentExecutor(model=server.model(), meter_provider=measured.provider).execute(
            parse_recipe(ONE_STEP)
        )
    assert otel_metrics.get_meter_provider() is before
    assert "minions.runs" in measured.names()


def test_retry_reasons_are_a_closed_set() -> None:
    from minions.errors import ModelOutputError, TransientModelError

    reason = metrics_module.retry_reason
    assert reason(TransientModelError("x", status_code=429)) == "rate_limited"
    assert reason(TransientModelError("x", status_code=502)) == "server_error"
    assert reason(TimeoutError()) == "timeout"
    assert reason(TransientModelError("connection refused")) == "connection"
    assert reason(ModelOutputError("bad json")) == "invalid_output"
    assert reason(ValueError("?")) == "other"


def test_counting_labels_is_safe_across_threads() -> None:
    capped = metrics_module._Capped(50)
    seen: list[str] = []

    def name_many(offset: int) -> None:
        seen.extend(capped(f"r{offset + n}") for n in range(100))

    threads = [threading.Thread(target=name_many, args=(n * 100,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({value for value in seen if value != metrics_module.OTHER}) == 50
