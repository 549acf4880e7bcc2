"""`minions run --otel`: a tracer provider that exports spans with OTLP, configured by the
standard ``OTEL_EXPORTER_OTLP_*`` variables (endpoint, headers, protocol, timeout...)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from minions.cli._errors import UsageError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__: list[str] = []

_PACKAGES = {
    "http/protobuf": (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry-exporter-otlp-proto-http",
    ),
    "grpc": (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry-exporter-otlp-proto-grpc",
    ),
}

_IN_THE_EXTRA = frozenset({"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"})
"""What ``pip install 'minions[otel]'`` brings beside the API."""


def otlp_tracer_provider() -> TracerProvider:
    """A provider that batches spans to the OTLP endpoint the environment names
    (``http://localhost:4318`` by default, as the exporter says). Shut it down at the end of
    the run: that sends what is left.

    Raises:
        UsageError: the SDK or the exporter is not installed, or the protocol is unknown.
    """
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol not in _PACKAGES:
        raise UsageError(
            f"--otel: OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not supported "
            f"(use {' or '.join(map(repr, _PACKAGES))})"
        )
    module, package = _PACKAGES[protocol]
    import importlib

    missing = []
    for name, distribution in (
        ("opentelemetry.sdk.trace", "opentelemetry-sdk"),
        (module, package),
    ):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(distribution)
    if missing:
        # The `otel` extra brings the SDK and the HTTP exporter; gRPC's exporter is apart.
        install = ["'minions[otel]'"] if _IN_THE_EXTRA.intersection(missing) else []
        install += [name for name in missing if name not in _IN_THE_EXTRA]
        raise UsageError(
            f"--otel ({protocol}) needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: pip install {' '.join(install)}"
        )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter_module = importlib.import_module(module)
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "minions"}
    provider = TracerProvider(resource=Resource.create(attributes))
    timeout = export_timeout()
    exporter = exporter_module.OTLPSpanExporter(**({} if timeout is None else {"timeout": timeout}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


EXPORT_TIMEOUT = 3.0
"""Seconds an export may take, retries included, unless ``OTEL_EXPORTER_OTLP_TIMEOUT`` says
otherwise: the exporter's own default (10 s) is what a run's end waited for a collector that
is not there."""


def export_timeout() -> float | None:
    """`EXPORT_TIMEOUT`, or ``None`` when the environment sets the exporter's timeout."""
    names = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    return None if any(os.environ.get(n) for n in names) else EXPORT_TIMEOUT
