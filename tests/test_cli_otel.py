"""`minions run --otel`: spans of the run reach the OTLP endpoint of the standard variables."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_helpers import AGENTS, write_recipe
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_cli import assert_no_traceback, invoke


class Collector:
    """An OTLP/HTTP trace receiver on 127.0.0.1 keeping the span names it is sent."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, str]]] = []
        self.paths: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.paths.append(self.path)
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    service = {a.key: a.value.string_value for a in resource.resource.attributes}
                    for scope in resource.scope_spans:
                        collector.spans.extend((s.name, service) for s in scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()
    found.thread.start()
    try:
        yield found
    finally:
        found.server.shutdown()
        found.server.server_close()


def test_otel_sends_the_runs_spans_to_the_configured_endpoint(
    tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    recipe = write_recipe(tmp_path, AGENTS)
    result = invoke(["run", str(recipe), "--model", "test", "--otel", "--quiet"])
    assert result.exit_code == 0, result.stderr
    assert collector.paths
    assert set(collector.paths) == {"/v1/traces"}
    names = sorted(name for name, _ in collector.spans)
    assert names == sorted(
        [
            "invoke_workflow greetings",
            "invoke_agent hello",
            "invoke_agent loud",
            "invoke_agent bye",
            "chat stand-in test",
            "chat stand-in test",
            "execute_tool shout",
        ]
    )
    assert {service["service.name"] for _, service in collector.spans} == {"minions"}


@pytest.mark.parametrize(
    ("absent", "protocol", "said"),
    [
        (
            ["opentelemetry.exporter.otlp.proto.http.trace_exporter"],
            "http/protobuf",
            "--otel (http/protobuf) needs opentelemetry-exporter-otlp-proto-http, which is not "
            "installed: pip install 'minions[otel]'",
        ),
        (
            ["opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"],
            "http/protobuf",
            "--otel (http/protobuf) needs opentelemetry-sdk and "
            "opentelemetry-exporter-otlp-proto-http, which are not installed: "
            "pip install 'minions[otel]'",
        ),
        (
            ["opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"],
            "grpc",
            "--otel (grpc) needs opentelemetry-sdk and opentelemetry-exporter-otlp-proto-grpc, "
            "which are not installed: pip install 'minions[otel]' "
            "opentelemetry-exporter-otlp-proto-grpc",
        ),
    ],
)
def test_otel_names_exactly_what_is_missing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    absent: list[str],
    protocol: str,
    said: str,
) -> None:
    # As if these were not installed: their imports fail.
    for module in absent:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    recipe = write_recipe(tmp_path, AGENTS)
    result = invoke(["run", str(recipe), "--model", "test", "--otel"])
    assert result.exit_code == 2
    assert said in " ".join(result.stderr.split())
    assert_no_traceback(result)


def test_the_otel_extra_brings_what_otel_needs() -> None:
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    otel = {
        requirement.name
        for requirement in map(Requirement, requires("minions") or [])
        if requirement.marker is not None and requirement.marker.evaluate({"extra": "otel"})
    }
    assert otel == {
        "opentelemetry-api",
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-http",
    }
