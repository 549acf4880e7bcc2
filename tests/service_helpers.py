"""The run service in tests: `minions serve` in a process of its own (or uvicorn in a thread
of the test process), on 127.0.0.1 and a free port, over a store in a temporary folder, with
recipes that need no model: a chain of ledger steps, one that waits for a person's approval,
and one that fails until a file exists."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
from runs_helpers import WORKER_ENV, stop_process, write_ledger_recipe

TOKEN = "test-token-0123456789"

SHOUT_TOOLS = '''\
import os
from pathlib import Path

from minions import tool


@tool
def shout(text: str) -> str:
    """Shout."""
    return text.upper()


@tool
def flaky(text: str) -> str:
    """Fail until the file named by $FLAKY_OK exists."""
    if not Path(os.environ["FLAKY_OK"]).exists():
        raise RuntimeError("not yet")
    return text
'''

APPROVAL = """\
id: release
description: Shout, once a person said yes.
tools: [shouting]
inputs: {text: {type: string, default: ship it}}
steps:
  - id: say
    tool: shout
    params: {text: "{{ inputs.text }}"}
    requires_approval: true
  - id: after
    depends_on: [say]
    tool: shout
    params: {text: done}
"""

FLAKY = """\
id: flaky
description: Fails until a file exists; resume it then.
tools: [shouting]
steps:
  - id: first
    tool: shout
    params: {text: one}
  - id: second
    depends_on: [first]
    tool: flaky
    params: {text: two}
    config: {max_tool_call_retries: 0}
"""


def write_recipes(folder: Path) -> Path:
    """The recipes folder: ``ledger`` (five steps; `slow` too, a second per step),
    ``release`` and ``flaky``."""
    folder.mkdir(parents=True, exist_ok=True)
    write_ledger_recipe(folder)
    slow = write_ledger_recipe(folder, seconds=0.3, name="slow.yaml")
    slow.write_text(slow.read_text().replace("id: ledger", "id: slow", 1))
    (folder / "shouting.py").write_text(SHOUT_TOOLS)
    (folder / "approval.yaml").write_text(APPROVAL)
    (folder / "flaky.yaml").write_text(FLAKY)
    return folder


ANSWER = "Bees dance to tell the hive where the flowers are."


@contextmanager
def gated_model() -> Iterator[tuple[Any, threading.Event]]:
    """A model server answering `ANSWER` once the test says go (the event): token deltas are
    live only, so a test watches first."""
    from minions.testing import FakeOpenAIServer, FakeRequest

    go = threading.Event()

    def answer(request: FakeRequest) -> str:
        go.wait(60)
        return ANSWER

    with FakeOpenAIServer(answer) as server:
        yield server, go


def watch_answer(client: httpx2.Client, run_id: str, go: threading.Event) -> list[dict[str, Any]]:
    """The SSE messages of the run's event stream to its end; the gated model (`go`) answers
    once this client watches (its call's start read)."""
    messages = []
    with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
        for message in read_stream_iter(response):
            messages.append(message)
            if message["event"] == "model_call_started":
                go.set()
    return messages


def write_chat_recipe(folder: Path, model_url: str) -> None:
    """``chat``: one agent step, answered by the model server at `model_url`."""
    (folder / "chat.yaml").write_text(
        "id: chat\ndescription: One answer from a model, streamed.\n"
        f"model: openai-compatible:fake-model@{model_url}/v1\n"
        "steps:\n  - id: answer\n    goal: How do bees tell where flowers are?\n"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_healthy(
    base: str, process: subprocess.Popen[Any] | None = None, log: Path | None = None
) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx2.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text() if log else ''}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start: {log.read_text() if log else ''}")
        time.sleep(0.05)


class ServerProcess:
    """`minions serve` in a process of its own (`python`: how Python runs the command, e.g.
    ``("-c", code)`` for code that patches something first, then runs `minions.cli.main`)."""

    def __init__(
        self,
        folder: Path,
        url: str,
        *args: str,
        token: str | None = TOKEN,
        python: tuple[str, ...] = ("-m", "minions"),
        **env: str,
    ) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = folder / f"serve-{self.port}.log"
        self.out = folder / f"serve-{self.port}.out"
        environment = {**os.environ, **WORKER_ENV, **env}
        environment.pop("MINIONS_API_TOKEN", None)
        if token is not None:
            environment["MINIONS_API_TOKEN"] = token
        command = [
            sys.executable, *python, "serve", "--port", str(self.port),
            "--database-url", url, *args,
        ]  # fmt: skip
        with self.log.open("w") as log, self.out.open("w") as out:
            self.process = subprocess.Popen(
                command, cwd=folder, env=environment, stdout=out, stderr=log
            )
        wait_healthy(self.base, self.process, self.log)

    def stop(self) -> int:
        return stop_process(self.process)


@contextmanager
def server(folder: Path, url: str, *args: str, **env: Any) -> Iterator[ServerProcess]:
    process = ServerProcess(folder, url, *args, **env)
    try:
        yield process
    finally:
        process.stop()


@contextmanager
def app_in_thread(app: Any) -> Iterator[str]:
    """A real uvicorn server of `app` in a thread of this process; yields its base URL."""
    import uvicorn

    port = free_port()
    instance = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base)
        yield base
    finally:
        instance.should_exit = True
        thread.join(timeout=30)


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def submit(client: httpx2.Client, recipe: str, **inputs: Any) -> str:
    """Submit a run of a recipe of the server's folder; its id."""
    response = client.post("/runs", json={"recipe": recipe, "inputs": inputs})
    assert response.status_code == 201, response.text
    run_id: str = response.json()["run_id"]
    return run_id


def read_stream(
    response: httpx2.Response, *, stop_after: int | None = None
) -> list[dict[str, Any]]:
    """The SSE messages of a streaming response, each as {"id", "event", "data"} (data
    parsed), until the stream ends (or `stop_after` messages with an id)."""
    import json

    messages: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    with_id = 0
    for line in response.iter_lines():
        if line == "":
            if "data" in current:
                current["data"] = json.loads(current["data"])
                messages.append(current)
                if "id" in current:
                    with_id += 1
                    if stop_after is not None and with_id >= stop_after:
                        return messages
            current = {}
            continue
        if line.startswith(":"):
            current.setdefault("comments", 0)
            continue
        name, _, value = line.partition(":")
        current[name] = value.removeprefix(" ")
    return messages


def read_stream_iter(response: httpx2.Response) -> Iterator[dict[str, Any]]:
    """The SSE messages of a streaming response as they come, each as {"id", "event",
    "data"} (data parsed)."""
    import json

    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if line == "":
            if "data" in current:
                current["data"] = json.loads(current["data"])
                yield current
            current = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")


def raw_request(
    port: int,
    method: str,
    target: str,
    headers: dict[str, bytes] | None = None,
    body: bytes = b"",
    *,
    token: str | None = TOKEN,
) -> tuple[int, bytes]:
    """Send a request byte for byte (what an HTTP client would refuse to send), on a
    connection of its own; the answer's status and body."""
    head = [f"{method} {target} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    given = dict(headers or {})
    if token is not None:
        given.setdefault("Authorization", f"Bearer {token}".encode())
    if body:
        given.setdefault("Content-Type", b"application/json")
    given["Content-Length"] = str(len(body)).encode()
    head += [name.encode() + b": " + value for name, value in given.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
        connection.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split(b" ")[1]), rest.partition(b"\r\n\r\n")[2]


def _b64(raw: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


BAD_INPUTS: list[tuple[str, str, str, dict[str, bytes], bytes, int, str]] = [
    # name, method, target, headers, body, status, what the message names
    ("last-event-id superscript", "GET", "/runs/x/events/stream",
     {"Last-Event-ID": b"\xb2"}, b"", 400, "Last-Event-ID"),
    ("last-event-id latin-1", "GET", "/runs/x/events/stream",
     {"Last-Event-ID": b"1\xe9"}, b"", 400, "Last-Event-ID"),
    ("last-event-id arabic digit", "GET", "/runs/x/events/stream",
     {"Last-Event-ID": "\u0663".encode()}, b"", 400, "Last-Event-ID"),
    ("last-event-id too large", "GET", "/runs/x/events/stream",
     {"Last-Event-ID": b"9" * 30}, b"", 400, "Last-Event-ID"),
    ("authorization non-ascii", "GET", "/runs",
     {"Authorization": b"Bearer \xe9\xff"}, b"", 401, "key"),
    ("key non-ascii", "GET", "/runs", {"Authorization": b"Bearer mk_\xe9\xff"}, b"", 401, "key"),
    ("key name NUL", "POST", "/keys", {}, b'{"name": "a\\u0000", "role": "viewer"}', 400,
     "body.name"),
    ("key name lone surrogate", "POST", "/keys", {}, b'{"name": "\\ud800", "role": "viewer"}',
     400, "body.name"),
    ("key role NaN", "POST", "/keys", {}, b'{"name": "a", "role": NaN}', 400, "body.role"),
    ("key project NUL", "POST", "/keys", {},
     b'{"name": "a", "role": "viewer", "projects": ["p\\u0000"]}', 400, "body.projects"),
    ("key name in path NUL", "DELETE", "/keys/a%00", {}, b"", 400, "path"),
    ("run id NUL", "GET", "/runs/ab%00cd", {}, b"", 400, "path"),
    ("run id not UTF-8", "GET", "/runs/%ff%fe", {}, b"", 400, "path"),
    ("events of run id NUL", "GET", "/runs/a%00/events", {}, b"", 400, "path"),
    ("call id NUL", "POST", "/runs/x/approvals/c%00d", {}, b'{"approve": true}', 400, "path"),
    ("recipe filter NUL", "GET", "/runs?recipe=a%00b", {}, b"", 400, "query.recipe"),
    ("project filter NUL", "GET", "/runs?project=a%00b", {}, b"", 400, "query.project"),
    ("project filter too long", "GET", "/runs?project=" + "p" * 65, {}, b"", 422,
     "query.project"),
    ("submit project NUL", "POST", "/runs", {}, b'{"recipe": "ledger", "project": "a\\u0000"}',
     400, "body.project"),
    ("submit project lone surrogate", "POST", "/runs", {},
     b'{"recipe": "ledger", "project": "\\udc00"}', 400, "body.project"),
    ("submit project a path", "POST", "/runs", {},
     b'{"recipe": "ledger", "project": "../other"}', 422, "body.project"),
    ("submit project a number", "POST", "/runs", {}, b'{"recipe": "ledger", "project": 7}', 422,
     "body.project"),
    ("schedule project NUL", "POST", "/schedules", {},
     b'{"recipe": "ledger", "every": "1h", "project": "a\\u0000"}', 400, "body.project"),
    ("cursor NUL", "GET", "/runs?cursor=" + _b64(b'[1.0, "a\\u0000b"]'), {}, b"", 400, "cursor"),
    ("cursor NaN", "GET", "/runs?cursor=" + _b64(b'[NaN, "a"]'), {}, b"", 400, "cursor"),
    ("cursor nested", "GET", "/runs?cursor=" + _b64(b"[" * 250 + b"]" * 250), {}, b"", 400,
     "cursor"),
    ("idempotency key NUL", "POST", "/runs", {},
     b'{"recipe": "ledger", "inputs": {"tag": "a"}, "idempotency_key": "k\\u0000"}', 400,
     "body.idempotency_key"),
    ("input NUL", "POST", "/runs", {}, b'{"recipe": "ledger", "inputs": {"tag": "a\\u0000"}}',
     400, "body.inputs.tag"),
    ("input lone surrogate", "POST", "/runs", {},
     b'{"recipe": "ledger", "inputs": {"tag": "\\ud800"}}', 400, "body.inputs.tag"),
    ("input NaN", "POST", "/runs", {}, b'{"recipe": "ledger", "inputs": {"tag": NaN}}', 400,
     "body.inputs.tag"),
    ("input Infinity", "POST", "/runs", {}, b'{"recipe": "numbers", "inputs": {"n": Infinity}}',
     400, "body.inputs.n"),
    ("input -Infinity", "POST", "/runs", {},
     b'{"recipe": "numbers", "inputs": {"n": -Infinity}}', 400, "body.inputs.n"),
    ("input 1e999", "POST", "/runs", {}, b'{"recipe": "numbers", "inputs": {"n": 1e999}}', 400,
     "body.inputs.n"),
    ("input 'NaN' as text", "POST", "/runs", {}, b'{"recipe": "numbers", "inputs": {"n": "NaN"}}',
     400, "input 'n'"),
    ("input nested", "POST", "/runs", {},
     b'{"recipe": "ledger", "inputs": {"tag": ' + b"[" * 200 + b"]" * 200 + b"}}", 400,
     "body.inputs.tag"),
    ("body not UTF-8", "POST", "/runs", {}, b'{"recipe": "\xff"}', 400, "UTF-8"),
    ("reason NUL", "POST", "/runs/x/approvals/c", {}, b'{"approve": false, "reason": "\\u0000"}',
     400, "body.reason"),
    ("inline recipe NUL", "POST", "/runs", {}, b'{"recipe_yaml": "id: a\\u0000"}', 400,
     "body.recipe_yaml"),
]  # fmt: skip
"""Requests with bytes no client should send, and how each is refused: never a 5xx, and the
message names the field."""
