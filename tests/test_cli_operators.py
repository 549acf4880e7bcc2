"""The CLI as an operator meets it: in a pipe (progress lines while a model call takes long),
`runs show` of a failed run, a worker with no model replaying a recipe's recording, and
`validate` saying every problem at once. Commands run in processes of their own, with stdout
and stderr pipes, as in CI."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

import pytest
from cli_helpers import SLOW, write_recipe
from runs_helpers import finished, minions, worker

from minions import events as ev
from minions.runs import RunStore
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "activity_monitor"


def _offline(**env: str) -> dict[str, str]:
    """Environment variables with no model configured."""
    return {"MINIONS_MODEL": "", "OPENAI_API_KEY": "", "OPENAI_BASE_URL": "", **env}


@pytest.mark.slow
async def test_a_worker_without_a_model_replays_the_recording_beside_the_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's durable quickstart, offline: `minions worker & minions submit
    # examples/activity_monitor/recipe.yaml -i hours=48`.
    shutil.copytree(EXAMPLE, tmp_path / "example")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.delenv("MINIONS_MODEL", raising=False)
    recipe = tmp_path / "example" / "recipe.yaml"
    submitted = minions("submit", str(recipe), "-i", "hours=48", "--database-url", url)
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    store = RunStore(url)
    try:
        with worker(url, tmp_path, "offline", tmp_path / "ledger.txt", **_offline()) as process:
            assert await finished(store, run_id) == "completed"
            said = process.log.read_text()
        record = await store.get(run_id)
    finally:
        store.close()
    assert "no model set (MINIONS_MODEL): a recipe with a recording beside it replays it" in said
    assert record.error is None
    assert [s.status for s in record.steps] == ["completed"] * len(record.steps)
    assert record.output


FAILS_THEN_SKIPS = """\
id: failing_chain
tools: [tools]
steps:
  - {id: fine, tool: current_datetime}
  - {id: a_step_with_a_rather_long_name_that_must_never_be_cut, depends_on: [fine], tool: broken, params: {reason: on purpose}}
  - {id: after_it, depends_on: [a_step_with_a_rather_long_name_that_must_never_be_cut], tool: current_datetime}
  - {id: last_one, depends_on: [after_it], tool: current_datetime}
"""


@pytest.mark.slow
async def test_runs_show_of_a_failed_run_lists_its_failed_and_skipped_steps(
    tmp_path: Path,
) -> None:
    recipe = write_recipe(tmp_path, FAILS_THEN_SKIPS)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    submitted = minions("submit", str(recipe), "--database-url", url)
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    store = RunStore(url)
    try:
        with worker(url, tmp_path, "w1", tmp_path / "ledger.txt"):
            assert await finished(store, run_id) == "failed"
    finally:
        store.close()
    shown = minions("runs", "show", run_id, "--database-url", url, COLUMNS="80")
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert "completed" in rows["fine"]
    failed = rows["a_step_with_a_rather_long_name_that_must_never_be_cut"]
    assert "failed" in failed
    assert "broken: on purpose" in failed
    assert "skipped" in rows["after_it"]
    assert "skipped" in rows["last_one"]


@pytest.mark.slow
async def test_runs_show_of_a_run_whose_worker_died_says_so(tmp_path: Path) -> None:
    from runs_helpers import WORKER_ENV, ledger_lines, until, write_ledger_recipe

    recipe = write_ledger_recipe(tmp_path)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    gate = tmp_path / "gate"
    gate.touch()  # the first step holds after its effect while the gate exists
    run_id = minions("submit", str(recipe), "-i", "tag=t", "--database-url", url).stdout.strip()
    ledger = tmp_path / "ledger.txt"
    with worker(url, tmp_path, "doomed", ledger, GATE=str(gate)) as process:
        await until(lambda: len(ledger_lines(ledger)) == 1)
        process.kill()

    def shown() -> str:
        dead_after = WORKER_ENV["MINIONS_WORKER_DEAD_AFTER"]
        return minions(
            "runs", "show", run_id, "--database-url", url, MINIONS_WORKER_DEAD_AFTER=dead_after
        ).stdout

    await until(lambda: "seems dead" in shown())
    text = shown()
    assert f"run {run_id}: running" in text
    assert "hint: its worker doomed last beat" in text
    assert "start a worker (`minions worker`)" in text


GATED = """\
id: gated_model
steps:
  - id: warm_up_with_a_long_step_name_that_stays_whole_in_the_summary
    goal: Warm up.
  - id: think
    depends_on: [warm_up_with_a_long_step_name_that_stays_whole_in_the_summary]
    goal: Think for a long time.
"""


def _held_model(gate: threading.Event) -> FakeOpenAIServer:
    """A model server whose answers to the step `think` wait for `gate` (a slow call); other
    calls are answered at once. Each answer uses 7 + 3 tokens."""

    def reply(request: FakeRequest) -> FakeReply:
        text = " ".join(str(m.get("content") or "") for m in request.messages)
        if "Think for a long time" in text:
            gate.wait(60)  # bounded: a test that fails does not hang
        return FakeReply.text("done").with_usage(7, 3)

    return FakeOpenAIServer(reply)


def _lines_until(stream: IO[str], wanted: str) -> list[str]:
    """Lines read from `stream` up to the first one holding `wanted` (all of them at EOF)."""
    lines = []
    for line in stream:
        lines.append(line)
        if wanted in line:
            break
    return lines


def _minions_process(*args: str, cwd: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "minions", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **_offline(**{"MINIONS_PROGRESS_EVERY": "0.2", **env})},
    )


def test_minions_run_in_a_pipe_says_what_runs_during_a_slow_model_call(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(GATED)
    gate = threading.Event()
    with _held_model(gate) as server:
        model = f"openai-compatible:fake-model@{server.url}"
        process = _minions_process(
            "run", "recipe.yaml", "--model", model, cwd=tmp_path, COLUMNS="80"
        )
        assert process.stderr is not None
        try:
            before = _lines_until(process.stderr, "… ")
        finally:
            gate.set()
        out, rest = process.communicate(timeout=60)
    assert process.returncode == 0, "".join(before) + rest
    progress = before[-1]
    # Said while the call was held: the step, how long it has run, the tokens so far.
    assert progress.startswith("… "), "".join(before)
    assert "running think (" in progress
    assert "; 10 tokens so far" in progress
    assert out.strip() == "done"
    # The summary names every step whole, even 80 columns wide.
    rows = [line.split()[0] for line in rest.splitlines() if "completed" in line]
    assert "warm_up_with_a_long_step_name_that_stays_whole_in_the_summary" in rows


@pytest.mark.slow
async def test_following_a_run_in_a_pipe_says_what_runs_during_a_slow_model_call(
    tmp_path: Path,
) -> None:
    (tmp_path / "recipe.yaml").write_text(GATED)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    gate = threading.Event()
    with _held_model(gate) as server:
        model = f"openai-compatible:fake-model@{server.url}"
        run_id = minions("submit", "recipe.yaml", "--database-url", url, cwd=tmp_path)
        assert run_id.returncode == 0, run_id.stderr
        with worker(url, tmp_path, "w1", tmp_path / "ledger.txt", MINIONS_MODEL=model):
            process = _minions_process(
                "runs", "events", run_id.stdout.strip(), "--follow", "--database-url", url,
                cwd=tmp_path,
            )  # fmt: skip
            assert process.stderr is not None
            try:
                said = _lines_until(process.stderr, "… ")
            finally:
                gate.set()
            out, _ = await asyncio.to_thread(process.communicate, timeout=60)
    assert said, "no progress line"
    assert said[-1].startswith(f"… run {run_id.stdout.strip()}: running think ("), said
    assert "; 10 tokens so far" in said[-1]
    assert "run_completed" in out.splitlines()[-1]


def test_minions_plan_in_a_pipe_says_it_is_planning_while_the_planner_thinks(
    tmp_path: Path,
) -> None:
    gate = threading.Event()

    def reply(request: FakeRequest) -> FakeReply:
        gate.wait(60)
        return FakeReply.failure(400, "this test needs no plan")

    with FakeOpenAIServer(reply) as server:
        model = f"openai-compatible:fake-model@{server.url}"
        process = _minions_process("plan", "Write a haiku.", "--model", model, cwd=tmp_path)
        assert process.stderr is not None
        try:
            said = _lines_until(process.stderr, "… ")
        finally:
            gate.set()
        process.communicate(timeout=60)
    assert said[-1].startswith(f"… planning with {model}: "), said


def test_minions_plan_without_a_model_says_how_to_give_one(tmp_path: Path) -> None:
    done = minions("plan", "Write a haiku.", cwd=tmp_path, **_offline())
    assert done.returncode == 2
    assert "no model is configured for the plan" in done.stderr
    assert "--model ollama:llama3.2:3b" in done.stderr
    assert "--replay" not in done.stderr
    assert "`model:`" not in done.stderr


SEVERAL_PROBLEMS = """\
id: broken
steps:
  - id: a
    goal: Do a.
    colour: red
  - id: b
    depends_on: [nope]
    goal: Do b.
    max_visits: lots
  - id: c
    tool: no_such_tool
  - id: d
    goal: "{{ zzz.output }}"
    next: [ghost]
"""


def test_validate_says_every_problem_of_a_recipe_in_one_pass_by_line(tmp_path: Path) -> None:
    # Problems of the format (an unknown field, a bad value) and of what the recipe means
    # (unknown steps, tools, template names) together, though each stage alone would stop.
    (tmp_path / "recipe.yaml").write_text(SEVERAL_PROBLEMS)
    done = minions("validate", "recipe.yaml", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0] == "invalid recipe: 6 problems"
    said = [(int(line.split(":")[1]), line.split(": ", 1)[1]) for line in lines[1:]]
    assert [number for number, _ in said] == [5, 7, 9, 11, 13, 14]
    assert "unknown field 'colour'" in said[0][1]
    assert "unknown step 'nope'" in said[1][1]
    assert "field 'max_visits'" in said[2][1]
    assert "unknown tool 'no_such_tool'" in said[3][1]
    assert "'zzz'" in said[4][1]
    assert "unknown step 'ghost'" in said[5][1]


def test_a_missing_input_is_a_field_for_the_api_and_an_option_for_the_cli(
    tmp_path: Path,
) -> None:
    from minions.errors import InputError
    from minions.recipes import parse_recipe
    from minions.service._recipes import problem_text

    recipe = parse_recipe("id: r\ninputs: {version: {type: string}}\nsteps: [{id: a, goal: x}]")
    with pytest.raises(InputError) as raised:
        recipe.check_inputs({})
    for_api = problem_text(raised.value)
    assert "'inputs.version'" in for_api
    assert "-i" not in for_api
    (tmp_path / "recipe.yaml").write_text(
        "id: r\ninputs: {version: {type: string}}\nsteps: [{id: a, tool: current_datetime}]\n"
    )
    done = minions("run", "recipe.yaml", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "invalid inputs: 1 problem",
        "  input 'version' is required (string)",
        "hint: give inputs as -i NAME=VALUE, e.g. -i version=...",
    ]


SLOW_THEN_MORE = SLOW + "  - {id: after, depends_on: [nap], goal: Wake up.}\n"
"""`SLOW`, and a step after its slow one."""


def test_after_ctrl_c_a_skipped_step_is_not_called_finished(tmp_path: Path) -> None:
    import signal
    import time

    recipe = write_recipe(tmp_path, SLOW_THEN_MORE)
    events = tmp_path / "events.jsonl"
    helpers = Path(__file__).parent / "cli_helpers.py"
    command = [sys.executable, str(helpers), "run", str(recipe), "--model", "test"]
    process = subprocess.Popen(
        [*command, "--events", str(events)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while '"step_id":"nap","seq"' not in (events.read_text() if events.exists() else ""):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the slow step never started"
            time.sleep(0.05)  # polled: only the events file can tell
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    said = [line for line in err.splitlines() if line.startswith("interrupted:")]
    assert said == [
        "interrupted: the run was cancelled. Finished: first; cancelled: nap; skipped: after"
    ], err


async def test_the_note_meant_for_the_model_never_reaches_a_person() -> None:
    # A reply cut off at the length limit, every time: the model is told "Answer again, more
    # briefly"; the events, the failed calls and the step's error say what happened instead.
    from minions import AgentContext, DefaultStep, ExecutionConfig, StepExecutor
    from minions.events import event_to_json

    seen: list[str] = []
    config = ExecutionConfig(max_output_retries=1)
    async with FakeOpenAIServer([FakeReply.cut_off()] * 2) as server:
        context = AgentContext(
            model=server.model(), config=config, listeners=[lambda e: seen.append(event_to_json(e))]
        )
        execution = await StepExecutor(DefaultStep("s", "Say a lot."), context).execute()
        asked = [r.messages[-1].get("content") for r in server.chat_requests]
    assert "Answer again, more briefly" in str(asked[-1])  # the model was told
    assert execution.error is not None
    said = [execution.error, *(c.error or "" for c in execution.model_calls), *seen]
    assert not [text for text in said if "Answer again" in text]
    assert "cut off at the length limit (max_tokens)" in execution.error


@pytest.mark.parametrize(
    ("variable", "expected"), [(None, 3.0), ("OTEL_EXPORTER_OTLP_TIMEOUT", None)]
)
def test_otel_exports_within_a_few_seconds_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, variable: str | None, expected: float | None
) -> None:
    # A collector that is not there must not hold the end of a run for the exporter's own
    # default of 10 s; a timeout the environment sets is the exporter's to read.
    from opentelemetry.exporter.otlp.proto.http import trace_exporter

    from minions.cli._otel import otlp_tracer_provider

    asked: list[dict[str, object]] = []

    class Exporter(trace_exporter.OTLPSpanExporter):
        def __init__(self, **options: Any) -> None:
            asked.append(options)
            super().__init__(**options)

    monkeypatch.setattr(trace_exporter, "OTLPSpanExporter", Exporter)
    for name in ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    if variable is not None:
        monkeypatch.setenv(variable, "20")
    otlp_tracer_provider().shutdown()
    assert asked == [{} if expected is None else {"timeout": expected}]


async def test_a_stream_stops_writing_once_its_client_is_gone() -> None:
    # A lost connection is closed by a callback of the event loop; a stream writing a burst of
    # stored events without yielding wrote on and on to it, and asyncio logged each write
    # after the fifth ("socket.send() raised exception."). Here the connection is lost at the
    # first event's write, as a server's transport loses it.
    from minions.service._stream import EventStream, OpenStreams

    class Runs:
        async def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[ev.Event]:
            for seq in range(1, 201):
                yield ev.StepStarted(run_id=run_id, step_id="a", seq=seq)

    # As uvicorn over an asyncio transport: a write that fails marks the transport lost at
    # once, and tells the server (`connection_lost`, then sends are dropped) in a callback.
    told = asyncio.Event()
    transport_lost = False
    writes_after_loss = 0

    async def receive() -> dict[str, Any]:
        await told.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal transport_lost, writes_after_loss
        if told.is_set():
            return  # uvicorn drops what is sent after connection_lost
        if transport_lost:
            writes_after_loss += 1  # asyncio logs these, from the fifth on
        elif message.get("body"):
            transport_lost = True
            asyncio.get_running_loop().call_soon(told.set)

    stream = EventStream(Runs(), "r", after=0, heartbeat=60, count=OpenStreams())  # type: ignore[arg-type]
    await stream({"type": "http"}, receive, send)  # type: ignore[arg-type]
    assert writes_after_loss < 5


@pytest.mark.slow
def test_serve_without_a_model_completes_an_example_from_its_recording(tmp_path: Path) -> None:
    # `minions serve --recipes examples/` with no model configured: the README's examples
    # complete offline, as `minions run` completes them.
    import time

    import httpx2
    from service_helpers import auth, server

    shutil.copytree(EXAMPLE, tmp_path / "examples" / "activity_monitor")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with server(tmp_path, url, "--recipes", str(tmp_path / "examples"), **_offline()) as s:
        with httpx2.Client(base_url=s.base, headers=auth(), timeout=30) as client:
            created = client.post(
                "/runs", json={"recipe": "activity_monitor", "inputs": {"hours": 48}}
            )
            assert created.status_code in (200, 201), created.text
            run_id = created.json()["run_id"]
            deadline = time.monotonic() + 60
            while (run := client.get(f"/runs/{run_id}").json())["status"] in (
                "queued",
                "running",
            ):
                assert time.monotonic() < deadline, run
                time.sleep(0.1)  # polled: only the server can tell
        said = s.log.read_text()
    assert run["status"] == "completed", run
    assert "no model set (MINIONS_MODEL): a recipe with a recording beside it replays it" in said


NEEDS_A_MODEL = """\
id: needs
steps:
  - {id: ask, goal: Say hi.}
  - {id: then, depends_on: [ask], goal: Say bye.}
"""


@pytest.mark.slow
def test_a_run_with_no_model_anywhere_is_said_once_at_submit_and_once_in_its_events(
    tmp_path: Path,
) -> None:
    (tmp_path / "recipe.yaml").write_text(NEEDS_A_MODEL)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    submitted = minions("submit", "recipe.yaml", "--database-url", url, cwd=tmp_path, **_offline())
    assert submitted.returncode == 0, submitted.stderr
    assert "note: no model is set here (MINIONS_MODEL)" in submitted.stderr
    run_id = submitted.stdout.strip()
    with worker(url, tmp_path, "w1", tmp_path / "ledger.txt", **_offline()):
        followed = minions("runs", "events", run_id, "--follow", "--database-url", url)
    assert followed.returncode == 1  # the run failed
    assert followed.stdout.count("no model configured") == 1, followed.stdout
    assert "(as above)" in followed.stdout.splitlines()[-1]
    said = minions("runs", "show", run_id, "--database-url", url).stdout
    assert said.count("no model configured") == 1, said
