"""`minions eval --durable`: case runs on the workers of a run store (SQLite and Postgres),
each submitted under its case job's key; a worker killed mid-eval and the eval process killed
too; the same command started again resumes the eval, and no finished case run runs again.
The report is kept in the store."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import assert_type

import pytest
from evals_helpers import CAPITALS, country, write
from runs_helpers import WorkerProcess, until, worker, write_ledger_recipe
from typer.testing import CliRunner

from minions import events as ev
from minions.cli import app
from minions.errors import ConfigError
from minions.evals import Case, CaseJob, Dataset, EvalReport, evaluate_durable, load_dataset
from minions.evals._durable import case_run_of
from minions.runs import OpenedEval, RunRecord, RunStore, StepRecord
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

DATASET = """\
recipe: capital.yaml
repeat: 2
checks:
  - expr: "steps.answer.status == 'completed'"
  - trajectory: {steps: [answer], order: exact}
cases:
  - id: france
    inputs: {country: France}
    expected: Paris
  - id: japan
    inputs: {country: Japan}
    expected: Tokyo
  - id: peru
    inputs: {country: Peru}
    expected: Lima
"""


class HeldModel:
    """Answers each capital right, counting requests by country; Peru's answers are held
    until `release` is set."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def reply(self, request: FakeRequest) -> FakeReply:
        name = country(str(request.last_message.get("content", "")))
        with self._lock:
            self.calls[name] += 1
        if name == "Peru":
            self.release.wait(120)
        return FakeReply.text(CAPITALS.get(name, "?"))


def _eval(folder: Path, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "minions", "eval", "capitals.yaml", "--durable",
         "--database-url", url, "--json"],
        cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def test_a_durable_eval_resumes_after_a_crash_without_repeating_a_finished_run(
    url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "evals"
    write(folder, DATASET)
    model = HeldModel()
    with FakeOpenAIServer(model.reply) as server:
        env = {
            "MINIONS_MODEL": f"openai-compatible:fake-model@{server.url}",
            "OPENAI_API_KEY": "sk-test",
        }
        ledger = tmp_path / "ledger.txt"
        workers = [WorkerProcess(url, tmp_path, f"w{n}", ledger, **env) for n in range(2)]
        store = RunStore(url)
        first = _eval(folder, url)
        second: subprocess.Popen[str] | None = None
        try:
            # France and Japan ran both their runs; Peru's two are in flight, held.
            await until(lambda: model.calls["Peru"] == 2 and sum(model.calls.values()) == 6)

            async def others_done() -> bool:
                runs = await store.list_runs(status="completed")
                return len(runs) == 4

            for _ in range(1200):
                if await others_done():
                    break
                await asyncio.sleep(0.05)
            assert await others_done()
            first.send_signal(signal.SIGKILL)  # the eval process dies...
            _, said = first.communicate(timeout=30)
            opened = re.search(r"eval (\w+) on the workers", said)
            assert opened is not None, said
            running = await store.list_runs(status="running")
            holder = next(w for w in workers if w.executor_id == running[0].executor_id)
            holder.kill()  # ...and a worker, mid-run
            model.release.set()
            second = _eval(folder, url)
            out, said = second.communicate(timeout=180)
        finally:
            model.release.set()
            for process in (first, second):
                if process is not None and process.poll() is None:
                    process.kill()
            for worker in workers:
                worker.stop()
        assert second.returncode == 0, said
        assert f"resuming eval {opened[1]}" in said
        # Every case run had been submitted: each was given back, none submitted again.
        assert "0 case runs submitted, 6 found in the store" in said
        report = EvalReport.model_validate_json(out)
        assert report.eval_id == opened[1]
        failures = [f.reason for c in report.cases for f in c.failures]
        assert [(c.id, c.passed, c.runs) for c in report.cases] == [
            ("france", 2, 2),
            ("japan", 2, 2),
            ("peru", 2, 2),
        ], failures
        # No finished case run ran again: one model call each; Peru's run on the killed
        # worker was taken over and asked again.
        assert model.calls["France"] == 2
        assert model.calls["Japan"] == 2
        assert model.calls["Peru"] >= 3
        assert await store.count_runs() == 6
        run_ids = {r for c in report.cases for r in c.run_ids}
        assert run_ids == {r.run_id for r in await store.list_runs()}
        kept = await store.evals()
        assert [(e.eval_id, e.status, e.total) for e in kept] == [(opened[1], "finished", 6)]
        assert kept[0].summary["pass_rate"] == 1.0
        found = await store.eval(opened[1])
        assert found is not None
        assert found.report is not None
        assert EvalReport.model_validate(found.report) == report
        await store.aclose()


async def test_an_eval_opened_again_resumes_until_it_finished_then_is_new(url: str) -> None:
    store = RunStore(url, create=True)
    try:
        first, resumed = await store.open_eval("abc", dataset="d", target="t", total=3)
        assert not resumed
        assert first.status == "running"
        opened = await store.open_eval("abc", dataset="d", target="t", total=3)
        assert_type(opened, OpenedEval)
        assert opened.resumed
        again = opened.record
        assert again.eval_id == first.eval_id
        assert opened == (again, True)  # a pair still, as it was
        other, resumed = await store.open_eval("xyz", dataset="d", target="t", total=1)
        assert not resumed
        assert other.eval_id != first.eval_id
        await store.keep_eval(first, {"eval_id": first.eval_id}, summary={"pass_rate": 0.5})
        kept = await store.eval(first.eval_id)
        assert kept is not None
        assert kept.status == "finished"
        assert kept.report == {"eval_id": first.eval_id}
        new, resumed = await store.open_eval("abc", dataset="d", target="t", total=3)
        assert not resumed
        assert new.eval_id != first.eval_id
        listed = await store.evals()
        assert {e.eval_id for e in listed} == {first.eval_id, other.eval_id, new.eval_id}
        assert all(e.report is None for e in listed)
        page = await store.evals(limit=1)
        rest = await store.evals(before=(page[0].created_at, page[0].eval_id))
        assert len(page) == 1
        assert len(rest) == 2
        assert page[0] not in rest
        # Pruned with the runs: every eval is older than a moment from now, but the newest.
        pruned = await store.prune(0, keep=1)
        assert pruned.evals == 2
        assert [e.eval_id for e in await store.evals()] == [page[0].eval_id]
        assert await store.eval(first.eval_id) is None
    finally:
        await store.aclose()


async def test_a_report_too_large_is_not_kept(tmp_path: Path) -> None:
    from minions.runs import _evals

    store = RunStore(f"sqlite:///{tmp_path / 'm.db'}", create=True)
    try:
        record, _ = await store.open_eval("f", dataset="d", target="t", total=1)
        big = {"x": "a" * (_evals.MAX_REPORT_BYTES + 1)}
        with pytest.raises(ValueError, match="over the"):
            await store.keep_eval(record, big, summary={})
        kept = await store.eval(record.eval_id)
        assert kept is not None
        assert kept.status == "running"
    finally:
        await store.aclose()


def test_runs_prune_says_how_many_kept_evals_went(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}"

    from minions.runs._db import Database
    from minions.runs._evals import finish_eval, open_eval

    store = Database(url, create=True)
    a_day_ago = time.time() - 86400
    open_eval(store, eval_id="e1", fingerprint="f", dataset="d", target="t", total=1, now=a_day_ago)
    finish_eval(store, "e1", report={}, summary={}, dataset="d", target="t", total=1, now=a_day_ago)
    store.close()
    prune = ["runs", "prune", "--older-than", "1h", "--database-url", url]
    dry = CliRunner().invoke(app, [*prune, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would delete 0 run(s)" in dry.output
    assert "and 1 kept eval(s)" in dry.output
    done = CliRunner().invoke(app, [*prune, "--json"])
    assert json.loads(done.output)["evals"] == 1


async def test_a_durable_eval_runs_recipe_files_only(tmp_path: Path) -> None:
    from minions import AgentRecipe, DefaultStep

    recipe = AgentRecipe(id="capital", steps=[DefaultStep("answer", "capital?")])
    store = RunStore(f"sqlite:///{tmp_path / 'm.db'}", create=True)
    try:
        with pytest.raises(ConfigError, match="not a recipe file"):
            await evaluate_durable(Dataset(recipe, [Case(id="a")]), store)
        dataset = load_dataset(write(tmp_path, DATASET))
        with pytest.raises(ConfigError, match="cannot take max_tokens, model"):
            await evaluate_durable(dataset, store, model="x", max_tokens=3)
    finally:
        await store.aclose()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--durable", "--model", "openai:x"], "--durable cannot take --model"),
        (["--durable", "--max-tokens", "5"], "--durable cannot take --max-tokens"),
        (["--durable", "--record", "r"], "--durable cannot take --record"),
        (["--database-url", "sqlite:///x.db"], "--database-url goes with --durable"),
    ],
)
def test_durable_options_that_cannot_apply_are_refused(
    tmp_path: Path, args: list[str], said: str
) -> None:
    path = write(tmp_path, DATASET)
    result = CliRunner().invoke(app, ["eval", str(path), *args])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not (tmp_path / "x.db").exists()


LEDGER_DATASET = """\
recipe: recipe.yaml
repeat: 1
checks:
  - trajectory: {tools: [mark, mark, mark, mark, mark], steps: [one, two, three, four, five],
                 order: exact, max_model_calls: 0}
  - expr: "tool_calls[0].result == 'a:one' && steps.five.output == 'a:five'"
cases:
  - id: a
    inputs: {tag: a}
"""


async def test_a_case_run_on_a_worker_is_graded_from_the_document_a_foreground_run_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from minions.evals import evaluate

    write_ledger_recipe(tmp_path)
    dataset = load_dataset(
        write(tmp_path, LEDGER_DATASET, recipe=(tmp_path / "recipe.yaml").read_text())
    )
    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv("LEDGER", str(ledger))
    here = await evaluate(dataset)
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    store = RunStore(url, create=True)
    documents = []

    def keep(event: object) -> None:
        from minions.evals import CaseRunFinished

        if isinstance(event, CaseRunFinished):
            documents.append(event.graded.run.document)

    try:
        with worker(url, tmp_path, "w1", ledger):
            there = await evaluate_durable(dataset, store, progress=keep)
    finally:
        await store.aclose()
    assert (here.passed, there.passed) == (1, 1), there.cases[0].failures
    foreground = (await evaluate(dataset, progress=keep), documents.pop())[1]
    durable = documents[0]
    ignored = {"run_id", "duration"}
    assert {k: v for k, v in durable.items() if k not in ignored} == {
        k: v for k, v in foreground.items() if k not in ignored
    } | {"steps": durable["steps"]}
    assert {
        s: {k: v for k, v in d.items() if k != "duration"} for s, d in durable["steps"].items()
    } == {
        s: {k: v for k, v in d.items() if k != "duration"} for s, d in foreground["steps"].items()
    }


def _job(tmp_path: Path) -> CaseJob:
    dataset = load_dataset(write(tmp_path, DATASET))
    return CaseJob(eval_id="e", target=dataset.targets[0], case=dataset.cases[0], repetition=1)


def _record(status: str, step_status: str) -> RunRecord:
    return RunRecord(
        run_id="r", recipe_id="capital", status=status, created_at=1.0, started_at=1.0,
        finished_at=2.0, error="boom" if status == "failed" else None,
        steps=(StepRecord(step_id="answer", visit=1, status=step_status),),
    )  # fmt: skip


def test_a_run_that_failed_for_want_of_a_model_is_an_error_not_a_failure(tmp_path: Path) -> None:
    unreachable: list[ev.Event] = [
        ev.StepStarted(step_id="answer"),
        ev.ModelCallStarted(step_id="answer", model="m"),
        ev.ModelCallFailed(step_id="answer", error="connection refused"),
        ev.StepFailed(step_id="answer", error="connection refused"),
    ]
    run = case_run_of(_job(tmp_path), _record("failed", "failed"), unreachable)
    assert run.problem == "the model could not be used in step 'answer': connection refused"
    # A model that answered wrong (tokens spent) is the agent's failure.
    answered: list[ev.Event] = [
        *unreachable[:2],
        ev.ModelCallFailed(
            step_id="answer", error="not valid JSON", usage=ev.UsageRecord(prompt_tokens=5)
        ),
        unreachable[3],
    ]
    run = case_run_of(_job(tmp_path), _record("failed", "failed"), answered)
    assert run.problem is None
    assert run.status == "failed"
    cancelled = case_run_of(_job(tmp_path), _record("cancelled", "completed"), [])
    assert cancelled.problem == "run r was cancelled: it says nothing of the agent"


def test_a_step_started_again_after_a_takeover_counts_once(tmp_path: Path) -> None:
    once: list[ev.Event] = [
        ev.StepStarted(step_id="answer"),
        ev.ModelCallStarted(step_id="answer", model="m"),
        ev.ToolCallStarted(step_id="answer", call_id="c1", name="look", arguments={"q": 1}),
    ]
    again: list[ev.Event] = [
        ev.StepStarted(step_id="answer"),  # a survivor took the run over
        ev.ModelCallStarted(step_id="answer", model="m"),
        ev.ToolCallStarted(step_id="answer", call_id="c2", name="look", arguments={"q": 2}),
        ev.ToolCallCompleted(step_id="answer", call_id="c2", name="look", content="found"),
        ev.ModelCallCompleted(
            step_id="answer", usage=ev.UsageRecord(prompt_tokens=3, completion_tokens=1, calls=1)
        ),
        ev.StepCompleted(step_id="answer", output="Paris"),
    ]
    run = case_run_of(_job(tmp_path), _record("completed", "completed"), [*once, *again])
    assert run.document["step_order"] == ["answer"]
    assert run.document["model_calls"] == 1
    assert run.document["tool_calls"] == [
        {"step": "answer", "name": "look", "arguments": {"q": 2}, "result": "found", "error": None}
    ]
    assert run.models["m"].total_tokens == 4


def test_a_runs_trail_is_read_from_the_one_fold_of_its_events(tmp_path: Path) -> None:
    def used(prompt: int, completion: int) -> ev.UsageRecord:
        return ev.UsageRecord(prompt_tokens=prompt, completion_tokens=completion, calls=1)

    events: list[ev.Event] = [
        ev.StepStarted(step_id="plan"),
        ev.ModelCallStarted(step_id="plan", model="a"),
        ev.ModelCallCompleted(step_id="plan", usage=used(2, 1)),
        ev.StepCompleted(step_id="plan"),
        ev.StepSkipped(step_id="publish", reason="not chosen"),  # told of before it starts
        ev.StepStarted(step_id="each"),
        ev.StepStarted(step_id="each[1]"),  # started first, its calls come later
        ev.StepStarted(step_id="each[0]"),
        ev.ModelCallStarted(step_id="each[0]", model="a"),
        ev.ModelCallCompleted(step_id="each[0]", usage=used(3, 1)),
        ev.ToolCallStarted(step_id="each[0]", call_id="c1", name="look", arguments={"q": 0}),
        ev.ToolCallCompleted(step_id="each[0]", call_id="c1", name="look", content="zero"),
        ev.StepCompleted(step_id="each[0]"),
        ev.ModelCallStarted(step_id="each[1]", model="b"),
        ev.ModelCallCompleted(step_id="each[1]", usage=used(4, 2)),
        ev.ToolCallStarted(step_id="each[1]", call_id="c1", name="look", arguments={"q": 1}),
        ev.ToolCallCompleted(step_id="each[1]", call_id="c1", name="look", content="one"),
        ev.ModelCallStarted(step_id="each[1]", model="b", turn=2),
        ev.ModelCallFailed(step_id="each[1]", turn=2, error="refused"),
        ev.StepFailed(step_id="each[1]", error="refused"),
        ev.StepFailed(step_id="each", error="item 1 failed"),
        ev.StepStarted(step_id="plan", visit=2),
        ev.ModelCallStarted(step_id="plan", model="b"),
        ev.ModelCallCompleted(step_id="plan", usage=used(5, 0)),
        ev.StepCompleted(step_id="plan", visit=2),
        ev.StepStarted(step_id="publish"),  # chosen now, in the visit it was skipped in
        ev.ToolCallStarted(step_id="publish", call_id="c1", name="post", arguments={"to": "x"}),
        ev.ToolCallFailed(step_id="publish", call_id="c1", name="post", error="denied"),
        ev.ModelCallStarted(step_id="publish", model="a"),
        ev.ModelCallFailed(step_id="publish", error="timed out"),
        ev.StepFailed(step_id="publish", error="timed out"),
    ]
    record = RunRecord(
        run_id="r", recipe_id="capital", status="failed", created_at=1.0, started_at=1.0,
        finished_at=2.0, error="boom",
        steps=tuple(
            StepRecord(step_id=s, visit=v, status=status)
            for s, v, status in (("plan", 1, "completed"), ("each", 1, "failed"),
                                 ("plan", 2, "completed"), ("publish", 1, "failed"))
        ),
    )  # fmt: skip
    run = case_run_of(_job(tmp_path), record, events)
    document = run.document
    # The steps in the order they first started, each visit once; not their loop items.
    assert document["step_order"] == ["plan", "each", "plan", "publish"]
    assert document["model_calls"] == 6
    steps = document["steps"]
    assert {s: (d["visits"], d["model_calls"]) for s, d in steps.items()} == {
        "plan": (2, 2),
        "each": (1, 3),
        "publish": (1, 1),
    }
    # By the execution they belong to, in the order those started.
    assert document["tool_calls"] == [
        {"step": "each", "name": "look", "arguments": {"q": 1}, "result": "one", "error": None},
        {"step": "each", "name": "look", "arguments": {"q": 0}, "result": "zero", "error": None},
        {"step": "publish", "name": "post", "arguments": {"to": "x"}, "result": None, "error": "denied"},
    ]  # fmt: skip
    assert [c["arguments"] for c in steps["each"]["tool_calls"]] == [{"q": 1}, {"q": 0}]
    # The tokens of each answer by the model asked, in the order the answers came.
    assert {m: (u.prompt_tokens, u.completion_tokens, u.calls) for m, u in run.models.items()} == {
        "a": (5, 2, 2),
        "b": (9, 2, 2),
    }
    assert list(run.models) == ["a", "b"]
    # The first execution to fail for want of a model names it, not the first told of.
    assert run.problem == "the model could not be used in step 'each[1]': refused"


def test_a_store_made_before_evals_were_kept_gets_their_table_when_opened(tmp_path: Path) -> None:
    import sqlite3

    from minions.runs._db import Database
    from minions.runs._tables import SCHEMA_VERSION

    path = tmp_path / "old.db"
    Database(f"sqlite:///{path}", create=True).close()
    with sqlite3.connect(path) as db:  # a schema 3 store: before step cache entries' runs
        db.execute("DROP TABLE minions_evals")
        db.execute("UPDATE minions_meta SET value = '3' WHERE key = 'schema_version'")
    Database(f"sqlite:///{path}").close()  # opened, not created: migrated 3 -> 4
    with sqlite3.connect(path) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        version = db.execute("SELECT value FROM minions_meta WHERE key = 'schema_version'")
        assert version.fetchone()[0] == str(SCHEMA_VERSION)
    assert "minions_evals" in tables
