"""`RunMetrics`: the OpenTelemetry metrics of runs, recorded where the work happens.

Only the ``opentelemetry-api`` package is used, imported when the metrics are built: the
library never sets a global provider nor exports anything itself; nothing is measured unless a
`MeterProvider` is given (``AgentExecutor(meter_provider=...)``, or ``minions serve --metrics``
and ``minions worker --metrics-port``, which export them to Prometheus).

Instruments (their Prometheus names after ``→``; see docs/operations.md):

* ``minions.runs`` → ``minions_runs_total{recipe,status}``: runs that ended in this process;
* ``minions.run.duration`` / ``minions.run.wait`` → ``minions_run_duration_seconds{recipe}``
  (the run's work: its time less the time it was blocked waiting) and
  ``minions_run_wait_seconds{recipe}`` (that waiting time);
* ``minions.step.duration`` / ``minions.step.wait`` → ``minions_step_duration_seconds`` and
  ``minions_step_wait_seconds{recipe,step}``: a step's work and its waits (for its
  endpoint's limits, for approvals), apart;
* ``minions.model_calls.in_flight`` / ``minions.model_call.waiters`` →
  ``minions_model_calls_in_flight{endpoint}`` / ``minions_model_call_waiters{endpoint}``;
* ``minions.model_call.retries`` → ``minions_model_call_retries_total{endpoint,reason}``;
* ``minions.tokens`` → ``minions_tokens_total{recipe,model,kind}`` (``input``, ``output``),
  counted as each call ends, so a running run's tokens show before it ends;
* the GenAI client metrics of the semantic conventions, ``gen_ai.client.token.usage`` and
  ``gen_ai.client.operation.duration``, with their attributes.

Label values are bounded: no run id is ever a label; recipe and step ids, models and
endpoints come from the server's own recipes and configuration, and each label keeps at most
`LABEL_LIMITS` distinct values in a process (more are counted under ``_other``), since inline
recipes, where a server allows them, name their own ids.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, Literal

from minions._text import redact_url
from minions._tracing import semconv as sc
from minions._tracing.tracer import ModelDescription, error_type
from minions._version import __version__
from minions.errors import MissingExtraError, ModelOutputError, TransientModelError
from minions.models import Model

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider

    from minions._messages import ModelCallResponse, Usage

__all__: list[str] = []

OTHER: Final = "_other"
"""The label value that stands for every value past a label's limit."""
LABEL_LIMITS: Final = {"recipe": 200, "step": 2000, "model": 100, "endpoint": 100}
"""Distinct values a label keeps in a process (``step``: pairs of recipe and step)."""

TOKEN_BUCKETS: Final = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
"""``gen_ai.client.token.usage``'s boundaries, as the conventions advise."""
DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
"""``gen_ai.client.operation.duration``'s boundaries, as the conventions advise."""
RUN_BUCKETS: Final = (
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600,
)  # fmt: skip
"""Seconds of runs, steps and their waits: from a cached step to a long day's run."""

RetryReason = Literal[
    "rate_limited", "server_error", "timeout", "connection", "invalid_output", "other"
]

_RECIPE: ContextVar[str | None] = ContextVar("minions_metrics_recipe", default=None)
"""The recipe label of the run being measured (its steps and calls run in tasks that inherit
it); ``None`` outside a run."""


class _Capped:
    """The values of one label: the first `limit` distinct ones as they are, the others
    `OTHER`."""

    __slots__ = ("_lock", "_seen", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self.limit:
                return OTHER
            self._seen.add(value)
        return value


def retry_reason(error: BaseException) -> RetryReason:
    """Why a model call is tried again, in a closed set of words (a bounded label)."""
    if isinstance(error, ModelOutputError):
        return "invalid_output"
    status = getattr(error, "status_code", None)
    if status == 429:
        return "rate_limited"
    if isinstance(status, int) and status >= 500:
        return "server_error"
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ConnectionError | TransientModelError):
        return "connection"
    return "other"


def endpoint_label(model: Model) -> str:
    """Where a model is served, as a label: its base URL without credentials (``""`` for a
    model not behind a server)."""
    endpoint = model.endpoint
    if endpoint is None:
        return ""
    return redact_url(endpoint[0].rstrip("/")).split("?", 1)[0]


@dataclasses.dataclass(frozen=True, slots=True)
class _Instruments:
    runs: Any
    run_duration: Any
    run_wait: Any
    step_duration: Any
    step_wait: Any
    in_flight: Any
    waiters: Any
    retries: Any
    tokens: Any
    token_usage: Any
    operation_duration: Any


class ModelMeter:
    """The metrics of one model's calls (made once per model and `RunMetrics`)."""

    __slots__ = ("_endpoint", "_genai", "_i", "_metrics", "_model_label", "model")

    def __init__(self, metrics: RunMetrics, model: Model) -> None:
        self.model = model  # held, so the cache key (its id) is not reused
        self._metrics = metrics
        self._i = metrics._i
        caps = metrics._caps
        self._endpoint = {"endpoint": caps["endpoint"](endpoint_label(model))}
        self._model_label = caps["model"](redact_url(model.name))
        described = ModelDescription(model)
        genai: dict[str, Any] = {sc.OPERATION_NAME: sc.OPERATION_CHAT, **described.attributes}
        genai[sc.REQUEST_MODEL] = caps["model"](str(genai[sc.REQUEST_MODEL]))
        self._genai = genai

    # -- a call in flight ----------------------------------------------------------------------

    def started(self) -> None:
        self._i.in_flight.add(1, self._endpoint)

    def answered(self, duration: float, response: ModelCallResponse) -> None:
        i = self._i
        i.in_flight.add(-1, self._endpoint)
        attributes = self._genai
        if response.model:
            attributes = {
                **attributes,
                sc.RESPONSE_MODEL: self._metrics._caps["model"](response.model),
            }
        i.operation_duration.record(duration, attributes)
        self._tokens(response.usage, attributes)

    def failed(self, duration: float, error: BaseException, usage: Usage) -> None:
        i = self._i
        i.in_flight.add(-1, self._endpoint)
        i.operation_duration.record(duration, {**self._genai, sc.ERROR_TYPE: _error_kind(error)})
        self._tokens(usage, self._genai)

    def stopped(self) -> None:
        """The call was cancelled: out of flight, nothing measured."""
        self._i.in_flight.add(-1, self._endpoint)

    def _tokens(self, usage: Usage, attributes: dict[str, Any]) -> None:
        if usage.unknown_calls or not (usage.prompt_tokens or usage.completion_tokens):
            return  # the server did not say: no count beats a wrong zero
        i = self._i
        recipe = _RECIPE.get() or ""
        for kind, count in (("input", usage.prompt_tokens), ("output", usage.completion_tokens)):
            i.tokens.add(count, {"recipe": recipe, "model": self._model_label, "kind": kind})
            i.token_usage.record(count, {**attributes, "gen_ai.token.type": kind})

    # -- waits and retries ---------------------------------------------------------------------

    def waiting(self) -> None:
        """A call began to wait for the endpoint's limits."""
        self._i.waiters.add(1, self._endpoint)

    def waited(self) -> None:
        """The wait is over (the call goes, or gave up)."""
        self._i.waiters.add(-1, self._endpoint)

    def retried(self, reason: RetryReason) -> None:
        self._i.retries.add(1, {**self._endpoint, "reason": reason})


def _error_kind(error: BaseException) -> str:
    status = getattr(error, "status_code", None)
    return str(status) if isinstance(status, int) else error_type(error)


class RunMetrics:
    """Records the metrics of runs to a `MeterProvider` (see the module's docstring).

    Args:
        provider: where the measurements go; the application configures it (readers,
            exporters, views).

    Raises:
        MissingExtraError: ``opentelemetry-api`` is not installed.
    """

    def __init__(self, provider: MeterProvider) -> None:
        try:
            import opentelemetry.metrics  # noqa: F401
        except ImportError:
            raise MissingExtraError(
                "metrics need the OpenTelemetry API: pip install 'minions[otel]'"
            ) from None
        self.provider = provider
        meter = provider.get_meter("minions", __version__)

        def seconds(name: str, description: str) -> Any:
            return meter.create_histogram(
                name,
                unit="s",
                description=description,
                explicit_bucket_boundaries_advisory=RUN_BUCKETS,
            )

        self._i = _Instruments(
            runs=meter.create_counter(
                "minions.runs", unit="{run}", description="Runs that ended, by recipe and status."
            ),
            run_duration=seconds(
                "minions.run.duration",
                "Seconds a run worked: from its start to its end, less the time "
                "it was blocked waiting.",
            ),
            run_wait=seconds(
                "minions.run.wait",
                "Seconds a run was blocked: every step it ran was waiting (for an "
                "endpoint's limits, for an approval).",
            ),
            step_duration=seconds(
                "minions.step.duration",
                "Seconds a step worked: its time less its waits.",
            ),
            step_wait=seconds(
                "minions.step.wait",
                "Seconds a step waited (its model calls for their endpoint's "
                "limits, its tool calls for approval).",
            ),
            in_flight=meter.create_up_down_counter(
                "minions.model_calls.in_flight",
                unit="{call}",
                description="Model calls sent and not answered yet, by endpoint.",
            ),
            waiters=meter.create_up_down_counter(
                "minions.model_call.waiters",
                unit="{call}",
                description="Model calls waiting for their endpoint's limits, by endpoint.",
            ),
            retries=meter.create_counter(
                "minions.model_call.retries",
                unit="{call}",
                description="Model calls tried again, by endpoint and reason.",
            ),
            tokens=meter.create_counter(
                "minions.tokens",
                unit="{token}",
                description="Tokens of model calls (as their servers reported), by recipe, "
                "model and kind (input, output).",
            ),
            token_usage=meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            ),
            operation_duration=meter.create_histogram(
                "gen_ai.client.operation.duration",
                unit="s",
                description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            ),
        )
        self._caps = {name: _Capped(limit) for name, limit in LABEL_LIMITS.items()}
        self._models: dict[int, ModelMeter] = {}

    def model(self, model: Model) -> ModelMeter:
        """The meter of `model`'s calls."""
        found = self._models.get(id(model))
        if found is None or found.model is not model:
            found = self._models[id(model)] = ModelMeter(self, model)
        return found

    @contextmanager
    def run(self, recipe_id: str) -> Iterator[bool]:
        """Inside: the run of `recipe_id` (its steps and calls are labelled with it). Yields
        whether it is a run of its own (False: a recipe step's inner run, counted as a step of
        the outer one)."""
        outer = _RECIPE.get() is None
        token = _RECIPE.set(self._caps["recipe"](recipe_id))
        try:
            yield outer
        finally:
            _RECIPE.reset(token)

    def run_ended(self, recipe_id: str, status: str, *, duration: float, waited: float) -> None:
        """A run ended (`status`: completed, failed or cancelled)."""
        recipe = self._caps["recipe"](recipe_id)
        i = self._i
        i.runs.add(1, {"recipe": recipe, "status": status})
        i.run_duration.record(max(0.0, duration - waited), {"recipe": recipe})
        i.run_wait.record(waited, {"recipe": recipe})

    def step_ended(self, step_id: str, *, duration: float, waited: float) -> None:
        """A step of the current run ended."""
        recipe = _RECIPE.get() or ""
        step = self._caps["step"](f"{recipe}\0{step_id}")
        labels = {"recipe": recipe, "step": step_id if step != OTHER else OTHER}
        i = self._i
        i.step_duration.record(max(0.0, duration - waited), labels)
        i.step_wait.record(waited, labels)
