"""`minions run --otel` against a real OTLP/HTTP receiver in a process of its own: the
`oteltest` package's sink (from the package index, in the `dev` extra), which decodes what the
real exporter sends over HTTP and prints it. What reaches it is what a GenAI backend renders:
an operation, a span kind and the run as the conversation on every span, the model's response
ids, and the tools offered to the model when content is captured (issue 25)."""

from __future__ import annotations

import ast
import json
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import write_recipe
from test_cli import invoke

from minions.testing import FakeOpenAIServer

RECEIVER = """
import logging, sys
from oteltest.sink import HttpSink
from oteltest.sink.handler import PrintHandler

HttpSink(PrintHandler(), logging.getLogger("otelsink"), port=int(sys.argv[1]), daemon=False).start()
"""
"""oteltest's `otelsink --http`, on a port of our choosing (the command's is fixed at 4318)."""

RECIPE = """\
id: greetings
tools: [tools]
steps:
  - id: hello
    goal: Greet Ada loudly.
    tools: [shout]
  - id: bye
    depends_on: [hello]
    goal: Say goodbye.
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Receiver:
    """The receiver's process, and the export requests it printed (one line each)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-c", RECEIVER, str(self.port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._wait_until_listening()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def _wait_until_listening(self) -> None:
        gate = threading.Event()
        for _ in range(600):  # a gate on the port, at most a minute
            assert self.process.poll() is None, "the OTLP receiver exited"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                gate.wait(0.1)
        raise AssertionError("the OTLP receiver never listened")

    def spans(self, count: int) -> list[dict[str, Any]]:
        """The spans received, once there are `count` (within a minute)."""
        found: list[dict[str, Any]] = []
        while len(found) < count:
            request = ast.literal_eval(self.lines.get(timeout=60))
            for resource in request["resourceSpans"]:
                for scope in resource["scopeSpans"]:
                    found.extend(scope["spans"])
        return found

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    try:
        yield started
    finally:
        started.stop()


def attributes(span: dict[str, Any]) -> dict[str, Any]:
    """A span's attributes as plain values (OTLP wraps each in its type)."""
    plain = {}
    for attribute in span.get("attributes", []):
        ((kind, value),) = attribute["value"].items()
        plain[attribute["key"]] = int(value) if kind == "intValue" else value
    return plain


def test_a_real_receiver_gets_spans_a_genai_backend_renders_fully(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    recipe = write_recipe(tmp_path, RECIPE)
    with FakeOpenAIServer([[("shout", {"text": "Ada"})], "HELLO ADA!", "Bye."]) as server:
        model = f"openai-compatible:fake-model@{server.url}"
        result = invoke(["run", str(recipe), "--model", model, "--otel", "--quiet"], None)
        assert result.exit_code == 0, result.stderr

    received = receiver.spans(7)
    assert sorted(span["name"] for span in received) == [
        "chat fake-model",
        "chat fake-model",
        "chat fake-model",
        "execute_tool shout",
        "invoke_agent bye",
        "invoke_agent hello",
        "invoke_workflow greetings",
    ]
    spans = {span["name"]: span for span in received}
    chats = [span for span in received if span["name"] == "chat fake-model"]
    root = spans["invoke_workflow greetings"]
    run_id = attributes(root)["minions.run.id"]
    expected = {
        "invoke_workflow greetings": ("SPAN_KIND_INTERNAL", "invoke_workflow", "CHAIN"),
        "invoke_agent hello": ("SPAN_KIND_INTERNAL", "invoke_agent", "AGENT"),
        "invoke_agent bye": ("SPAN_KIND_INTERNAL", "invoke_agent", "AGENT"),
        "chat fake-model": ("SPAN_KIND_CLIENT", "chat", "LLM"),
        "execute_tool shout": ("SPAN_KIND_INTERNAL", "execute_tool", "TOOL"),
    }
    for span in received:
        name, found = span["name"], attributes(span)
        kind, operation, openinference = expected[name]
        assert span["kind"] == kind, name
        assert found["gen_ai.operation.name"] == operation, name
        assert found["openinference.span.kind"] == openinference, name
        assert found["gen_ai.conversation.id"] == run_id, name  # the run, on every span
    assert "parentSpanId" not in root
    assert attributes(root)["gen_ai.workflow.name"] == "greetings"
    assert attributes(root)["gen_ai.agent.name"] == "greetings"

    # Each chat span names the model's answer by the id the server gave it.
    response_ids = [attributes(chat)["gen_ai.response.id"] for chat in chats]
    assert all(str(i).startswith("chatcmpl-") for i in response_ids)
    assert len(set(response_ids)) == 3
    # The tools offered to the model, with content capture on.
    offered_to = [chat for chat in chats if "gen_ai.tool.definitions" in attributes(chat)]
    assert len(offered_to) == 2  # hello's two calls; bye has no tools
    offered = json.loads(attributes(offered_to[0])["gen_ai.tool.definitions"])
    assert offered[0]["type"] == "function"
    assert offered[0]["name"] == "shout"
    assert offered[0]["parameters"]["properties"]["text"]["type"] == "string"
