"""Prometheus metrics of a process (``minions serve --metrics``, ``minions worker
--metrics-port``): an OpenTelemetry SDK `MeterProvider` whose reader is the
opentelemetry-exporter-prometheus bridge into a prometheus-client registry of the process's
own (never the global ones of either library), and the text exposition of that registry with
any gauges computed at scrape time beside it.

Why both libraries: the library records with the OpenTelemetry API (as its traces), so one
`MeterProvider` can feed Prometheus here and OTLP elsewhere; the bridge turns its instruments
into Prometheus names and types; prometheus-client writes the exposition and holds the
gauges a scrape computes from the store (its custom-collector way), so no exposition is
written by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

from minions._tracing.metrics import RunMetrics
from minions.errors import MissingExtraError

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__: list[str] = []

INSTALL: Final = "pip install 'minions[metrics]'"


class _Scrape:
    """What one exposition writes: the process's registry, then the gauges given."""

    def __init__(self, registry: Any, extra: Iterable[Metric]) -> None:
        self.registry = registry
        self.extra = extra

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        yield from self.extra


class PrometheusMetrics:
    """The metrics of this process, ready to scrape.

    Attributes:
        provider: the SDK's `MeterProvider` (give it to `AgentExecutor(meter_provider=...)`).
        metrics: the `RunMetrics` recording to it (what `RunSettings.metrics` takes).
        registry: the prometheus-client registry it is read through.

    Raises:
        MissingExtraError: the SDK, the exporter or prometheus-client is not installed.
    """

    content_type: str

    def __init__(self) -> None:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.resources import Resource
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
        except ImportError:
            raise MissingExtraError(
                f"Prometheus metrics need the metrics extra: {INSTALL}"
            ) from None
        self.registry = CollectorRegistry(auto_describe=False)
        # Labels are the instruments' own: no scope labels on every series.
        reader = PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)
        self.provider = MeterProvider(
            metric_readers=[reader], resource=Resource.create({"service.name": "minions"})
        )
        self.metrics = RunMetrics(self.provider)
        self.content_type = CONTENT_TYPE_LATEST

    def exposition(self, extra: Iterable[Metric] = ()) -> bytes:
        """The text exposition of the process's metrics and `extra` (blocking: the bridge
        collects the instruments; call it off an event loop)."""
        from prometheus_client import generate_latest

        return generate_latest(_Scrape(self.registry, extra))

    def shutdown(self) -> None:
        self.provider.shutdown()
