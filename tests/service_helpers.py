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
    """`minions serve` in a process of its own."""

    def __init__(
        self,
        folder: Path,
        url: str,
        *args: str,
        token: str | None = TOKEN,
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
            sys.executable, "-m", "minions", "serve", "--port", str(self.port),
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
