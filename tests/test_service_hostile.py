"""`minions serve` as an attacker finds it: real server processes on 127.0.0.1 (an API that
takes inline recipes and runs nothing, and a `minions worker` beside it on the same store),
each attack a test.

Inline recipes try to make the server import code, read or write files, or reach hosts of
their choosing, with fresh ids and paths (absolute, ``..``, ``/proc/self``, a symbolically
linked folder, Windows-style, URL-encoded, a module written after the server started): every
one is refused naming the field, no module outside the recipes folder is imported (each
would write a marker), none is imported by the API process (only by the worker), and no file
outside the runs' workspace changes. Requests with bytes no client should send are 400s
naming the field, the same on SQLite and Postgres. A client's runs whose model answers 429
with a hostile ``Retry-After``, or prose to a prompt made for it, pause the endpoint for the
others for the limits' `max_pause` at most, and demote no output mode for them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from postgres import cluster, fresh_database
from runs_helpers import worker
from service_helpers import (
    BAD_INPUTS,
    ServerProcess,
    auth,
    raw_request,
    read_stream,
    server,
    submit,
    write_recipes,
)

pytestmark = pytest.mark.slow

MODEL = "openai-compatible:fake-model@http://127.0.0.1:9/v1"
"""The server's own model (never called here: the recipes that name it have tool steps)."""

MARKER_TOOLS = '''\
import os
from pathlib import Path

from minions import tool

Path(os.environ["MARKERS"], "{name}-" + str(os.getpid())).write_text("imported")


@tool
def stamp(text: str) -> str:
    """Stamp."""
    return "stamped " + text
'''

NUMBERS = """\
id: numbers
tools: [shouting]
inputs: {n: {type: number}}
steps: [{id: a, tool: shout, params: {text: "{{ inputs.n }}"}}]
"""


def evil(folder: Path, name: str = "evil") -> None:
    """A tools module that leaves a marker when imported, and a recipe naming it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(MARKER_TOOLS.replace("{name}", name))
    (folder / f"{name}.yaml").write_text(
        f"id: {name}\ntools: [{name}]\nsteps: [{{id: a, tool: stamp, params: {{text: x}}}}]\n"
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The servers' folder: the recipes (with a trusted module that leaves a marker, and a
    link to a folder outside), an outside folder, and evil modules wherever a client might
    have put one (the current directory, a run's workspace)."""
    root = tmp_path_factory.mktemp("hostile")
    recipes = write_recipes(root / "recipes")
    (recipes / "marker.py").write_text(MARKER_TOOLS.replace("{name}", "marker"))
    (recipes / "numbers.yaml").write_text(NUMBERS)
    evil(root / "outside")
    (recipes / "linked").symlink_to(root / "outside", target_is_directory=True)
    evil(root)  # the current directory: on the server's sys.path
    evil(root / ".minions" / "workspace" / "w")  # as a run's file tools would write it
    (root / "markers").mkdir()
    return root


@pytest.fixture(scope="module")
def url(folder: Path) -> str:
    return f"sqlite:///{folder / 'store' / 'minions.db'}"


@pytest.fixture(scope="module")
def api(folder: Path, url: str) -> Iterator[ServerProcess]:
    """An API process that takes inline recipes and runs nothing (its worker is apart)."""
    with server(
        folder,
        url,
        "--no-worker",
        "--allow-inline-recipes",
        "--recipes",
        str(folder / "recipes"),
        MARKERS=str(folder / "markers"),
        MINIONS_MODEL=MODEL,
    ) as process:
        # Written once the server runs: a module the server did not have at its start.
        evil(folder / "recipes", "late")
        yield process


@pytest.fixture(scope="module")
def client(api: ServerProcess) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=api.base, headers=auth(), timeout=60) as client:
        yield client


def markers(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "markers").iterdir())


def intruders(folder: Path) -> list[str]:
    """Markers of modules no request may have imported (the folder's own module is
    imported by the worker that runs it)."""
    return [m for m in markers(folder) if not m.startswith("marker-")]


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file of the folder but the runs' workspaces, the store, logs and bytecode:
    what a run must never touch."""
    found = {}
    for path in folder.rglob("*"):
        relative = path.relative_to(folder).as_posix()
        if (
            relative.startswith((".minions/workspace/", "store/", "markers/"))
            or "__pycache__" in relative
            or path.suffix in (".log", ".out")
            or not path.is_file()
            or path.is_symlink()
        ):
            continue
        stat = path.stat()
        found[relative] = (stat.st_size, stat.st_mtime_ns)
    return found


def refused(client: httpx2.Client, text: str, field: str) -> str:
    response = client.post("/runs", json={"recipe_yaml": text})
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"]["type"] == "invalid_recipe"
    message: str = body["error"]["message"]
    assert f"field {field!r}" in message, message
    return message


# -- inline recipes -------------------------------------------------------------------------


def test_an_inline_recipe_of_the_folders_module_runs_in_the_worker_only(
    api: ServerProcess, client: httpx2.Client, folder: Path, url: str
) -> None:
    """The trusted case, end to end: its module is imported by the worker that runs it,
    never by the API process that took it; its file tools write in its workspace only."""
    before = snapshot(folder)
    text = (
        "id: trusted\ntools: [marker]\nsteps:\n"
        "  - {id: a, tool: stamp, params: {text: hi}}\n"
        "  - {id: b, depends_on: [a], tool: write_file, "
        "params: {path: notes.txt, content: '{{ a.output }}'}}\n"
    )
    made = client.post("/runs", json={"recipe_yaml": text})
    assert made.status_code == 201, made.text
    assert markers(folder) == []  # checked, stored and queued: nothing imported
    run_id = made.json()["run_id"]
    with worker(
        url, folder, "hostile-worker", folder / "ledger.txt", MARKERS=str(folder / "markers")
    ) as w:
        with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
            assert read_stream(response)[-1]["event"] == "run_completed"
        assert markers(folder) == [f"marker-{w.process.pid}"]
    assert client.get(f"/runs/{run_id}").json()["output"] == {"path": "notes.txt", "bytes": 10}
    assert (folder / ".minions" / "workspace" / "trusted" / "notes.txt").read_text() == (
        "stamped hi"
    )
    assert f"marker-{api.process.pid}" not in markers(folder)
    assert snapshot(folder) == before


@pytest.mark.parametrize(
    "recipe_id",
    ["/proc/self", "../up1", "a/b2", "C:\\win3", "..\\win4", "%2e%2e%2fenc5", ".", "..", "x" * 65],
)
def test_an_inline_recipe_id_is_a_slug(client: httpx2.Client, recipe_id: str) -> None:
    import json

    text = f"id: {json.dumps(recipe_id)}\nsteps: [{{id: a, tool: current_datetime}}]\n"
    refused(client, text, "id")


TOOLS_REFERENCES = [
    "os",
    "json:loads",
    "evil",  # the server's current directory, on its sys.path
    "late",  # written in the recipes folder after the server started
    "linked.evil",  # a folder of the recipes that links outside
    ".minions.workspace.w.evil",
    "../outside/evil",
    "{root}/outside/evil",
    "/proc/self/cwd/outside/evil",
    "..\\outside\\evil",
    "%2e%2e.outside.evil",
    "marker/../../evil",
]


INCLUDES = [
    "../outside/evil.yaml",
    "{root}/outside/evil.yaml",
    "linked/evil.yaml",
    "/proc/self/cwd/outside/evil.yaml",
    "/proc/self/cwd/recipes/approval.yaml",
    "..\\outside\\evil.yaml",
    "%2e%2e/outside/evil.yaml",
    "../.minions/workspace/w/evil.yaml",
    "late.yaml",
]


@pytest.mark.parametrize(
    ("kind", "reference"),
    [("tools", r) for r in TOOLS_REFERENCES] + [("recipe", i) for i in INCLUDES],
)
def test_an_inline_recipe_reaches_only_modules_and_recipes_found_at_the_start(
    client: httpx2.Client, folder: Path, kind: str, reference: str
) -> None:
    """A tools module or an included recipe must be a file of the recipes folder as the
    server found it when it started."""
    name = reference.replace("{root}", str(folder))
    if kind == "tools":
        text = f"id: tools-attack\ntools: ['{name}']\nsteps: [{{id: a, tool: stamp}}]\n"
        assert "recipes folder" in refused(client, text, "tools.0")
    else:
        text = f"id: include-attack\nsteps: [{{id: a, recipe: '{name}'}}]\n"
        assert "include only recipes" in refused(client, text, "recipe")
    assert intruders(folder) == []


def test_an_inline_recipe_may_include_a_recipe_of_the_folder(client: httpx2.Client) -> None:
    text = "id: includes\nsteps: [{id: a, recipe: approval.yaml}]\n"
    made = client.post("/runs", json={"recipe_yaml": text})
    assert made.status_code == 201, made.text
    assert client.post(f"/runs/{made.json()['run_id']}/cancel").status_code == 200


@pytest.mark.parametrize(
    ("fragment", "field"),
    [
        ("workspace: /\n", "workspace"),
        ("workspace: ../outside\n", "workspace"),
        ("http: {allowed_hosts: ['127.0.0.1:{port}']}\n", "http.allowed_hosts"),
        ("mcp_servers: {x: {command: touch, args: ['{root}/mcp-ran']}}\n", "mcp_servers"),
        ("mcp_servers: {x: {url: 'http://127.0.0.1:{port}/mcp'}}\n", "mcp_servers"),
        ("model: 'openai-compatible:m@http://127.0.0.1:{port}/v1'\n", "model"),
        ("model: 'vllm:m'\n", "model"),
        ("model: 'ollama:m'\n", "model"),
        ("model: 'llamacpp:m'\n", "model"),
        ("model: 'openai:gpt-4o'\n", "model"),
    ],
)
def test_an_inline_recipe_cannot_widen_the_servers_files_hosts_or_models(
    api: ServerProcess, client: httpx2.Client, folder: Path, fragment: str, field: str
) -> None:
    head = fragment.replace("{port}", str(api.port)).replace("{root}", str(folder))
    text = f"id: widen\n{head}steps: [{{id: a, tool: current_datetime}}]\n"
    refused(client, text, field)
    assert not (folder / "mcp-ran").exists()


def test_an_inline_recipe_may_name_a_model_served_where_the_servers_is(
    client: httpx2.Client,
) -> None:
    other = MODEL.replace("fake-model", "other-model")
    text = f"id: same-endpoint\nmodel: '{other}'\nsteps: [{{id: a, tool: current_datetime}}]\n"
    made = client.post("/runs", json={"recipe_yaml": text})
    assert made.status_code == 201, made.text
    assert client.post(f"/runs/{made.json()['run_id']}/cancel").status_code == 200


def test_nothing_was_imported_by_the_api_process(api: ServerProcess, folder: Path) -> None:
    assert not any(m.endswith(f"-{api.process.pid}") for m in markers(folder))
    assert intruders(folder) == []


# -- reruns: a rerun is a submit ------------------------------------------------------------

OPERATOR = """\
id: {id}
inputs: {{path: {{type: string}}}}
steps: [{{id: read, tool: read_file, params: {{path: "{{{{ inputs.path }}}}"}}}}]
"""
"""An operator's recipe (run by the CLI or Python, outside the server's folder): it reads a
file of its workspace named by an input."""


def ended(url: str, recipe: Path | None = None, *, text: str = "", **inputs: Any) -> str:
    """A run stored as the CLI or Python would store it (of the file `recipe`, or of inline
    YAML `text` as the server's folder's inline recipe), cancelled before it ran: an ended
    run to rerun."""
    import asyncio

    from minions.runs import RunStore

    async def make() -> str:
        async with RunStore(url, create=True) as store:
            if recipe is not None:
                run_id, _ = await store.submit(recipe, inputs)
            else:
                base = Path(url.removeprefix("sqlite:///")).parent.parent / "recipes"
                run_id, _ = await store.submit_yaml(text, inputs, base=base)
            await store.cancel(run_id)
            return run_id

    return asyncio.run(make())


def children(client: httpx2.Client, parent: str) -> list[str]:
    """The runs that rerun `parent`."""
    runs = client.get("/runs", params={"limit": 500}).json()["runs"]
    found = []
    for summary in runs:
        shown = client.get(f"/runs/{summary['run_id']}").json()
        if shown["parent_run_id"] == parent:
            found.append(summary["run_id"])
    return found


@pytest.mark.parametrize("name", ["loopback", "passwords"])
def test_a_rerun_cannot_run_an_operators_recipe_with_new_inputs(
    client: httpx2.Client, folder: Path, url: str, name: str
) -> None:
    """An operator's recipe (outside the folder) that may reach what clients may not: a
    client's rerun with a new `path` is refused (a 403 naming why), nothing is queued; the
    operator's own face (the store, as `minions runs rerun`) keeps its reach."""
    import asyncio

    from minions.runs import RunStore

    operator = folder / "operator" / name
    operator.mkdir(parents=True, exist_ok=True)
    recipe = operator / "secrets.yaml"
    recipe.write_text(OPERATOR.format(id=f"secrets-{name}"))
    parent = ended(url, recipe, path="notes.txt")
    for inputs, route in itertools.product(
        ({"path": "/etc/passwd"}, {"path": "../../secret.txt"}, {}), ("rerun", "rerun/preview")
    ):  # a preview reaches what the rerun does, no more
        response = client.post(
            f"/runs/{parent}/{route}", json={"from_step": "read", "inputs": inputs}
        )
        assert response.status_code == 403, response.text
        message = response.json()["error"]["message"]
        assert f"'secrets-{name}' is not a recipe of this server's folder" in message
        assert str(folder) not in message
    assert children(client, parent) == []

    async def operator_reruns() -> str:
        async with RunStore(url) as store:
            plan = await store.rerun(parent, from_step="read", inputs={"path": "other.txt"})
            await store.cancel(plan.run_id)
            return plan.run_id

    operators = asyncio.run(operator_reruns())
    assert children(client, parent) == [operators]


def test_a_rerun_takes_the_folders_recipe_of_that_id_as_it_is_now(
    client: httpx2.Client, folder: Path, url: str
) -> None:
    """A run whose snapshot came from elsewhere (a file with a folder recipe's id) is rerun
    with the folder's recipe, not its snapshot; a run whose recipe left the folder is not
    rerun at all."""
    elsewhere = folder / "operator" / "numbers.yaml"
    elsewhere.parent.mkdir(parents=True, exist_ok=True)
    elsewhere.write_text(OPERATOR.format(id="numbers"))
    parent = ended(url, elsewhere, path="notes.txt")
    response = client.post(
        f"/runs/{parent}/rerun", json={"from_step": "read", "inputs": {"path": "/etc/passwd"}}
    )
    # The folder's `numbers` has no step `read`, and takes no input `path`.
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] in ("invalid_rerun", "invalid_inputs")
    numbers = client.post("/runs", json={"recipe": "numbers", "inputs": {"n": 1}}).json()
    client.post(f"/runs/{numbers['run_id']}/cancel")
    rerun = client.post(f"/runs/{numbers['run_id']}/rerun", json={"from_step": "a"})
    assert rerun.status_code == 201, rerun.text
    shown = client.get(f"/runs/{rerun.json()['run_id']}").json()
    assert shown["recipe"] == "numbers"
    assert children(client, parent) == []
    gone = folder / "recipes" / "gone.yaml"
    gone.write_text(NUMBERS.replace("id: numbers", "id: gone"))
    made = client.post("/runs", json={"recipe": "gone", "inputs": {"n": 1}}).json()["run_id"]
    client.post(f"/runs/{made}/cancel")
    gone.unlink()
    for route in ("rerun", "rerun/preview"):
        refused_now = client.post(f"/runs/{made}/{route}", json={"from_step": "a"})
        assert refused_now.status_code == 403, refused_now.text
        message = refused_now.json()["error"]["message"]
        assert "'gone' is not a recipe of this server's folder" in message


def test_an_inline_rerun_obeys_the_inline_rules_of_now(
    client: httpx2.Client, folder: Path, url: str
) -> None:
    """An inline run is rerun while the server takes inline recipes; not by a server started
    without --allow-inline-recipes (on the same store), and not when its YAML breaks the
    inline rules (stored by Python as if inline, with an MCP server to start)."""
    text = "id: inlined\ntools: [shouting]\nsteps: [{id: a, tool: shout, params: {text: hi}}]\n"
    made = client.post("/runs", json={"recipe_yaml": text})
    assert made.status_code == 201, made.text
    parent = made.json()["run_id"]
    client.post(f"/runs/{parent}/cancel")
    again = client.post(f"/runs/{parent}/rerun", json={"from_step": "a"})
    assert again.status_code == 201, again.text
    with (
        server(folder, url, "--no-worker", "--recipes", str(folder / "recipes")) as strict,
        httpx2.Client(base_url=strict.base, headers=auth(), timeout=60) as other,
    ):
        for route in ("rerun", "rerun/preview"):
            refused_now = other.post(f"/runs/{parent}/{route}", json={"from_step": "a"})
            assert refused_now.status_code == 403, refused_now.text
            assert "takes no inline recipes now" in refused_now.json()["error"]["message"]
    assert children(client, parent) == [again.json()["run_id"]]
    mcp = (
        "id: spawner\nmcp_servers: {sh: {command: /bin/sh, args: [-c, 'touch /tmp/x']}}\n"
        "steps: [{id: a, tool: current_datetime}]\n"
    )
    smuggled = ended(url, text=mcp)
    for route in ("rerun", "rerun/preview"):
        answer = client.post(f"/runs/{smuggled}/{route}", json={"from_step": "a"})
        assert answer.status_code == 400, answer.text
        assert "field 'mcp_servers'" in answer.json()["error"]["message"]
    assert children(client, smuggled) == []


def test_a_rerun_retried_with_its_idempotency_key_is_one_rerun(
    store_api: ServerProcess, folder: Path
) -> None:
    """Five retries of one rerun make one run (the header or the body's key); the key with
    another request is a 409, and two different keys in one request a 400."""
    with httpx2.Client(base_url=store_api.base, headers=auth(), timeout=60) as client:
        made = client.post("/runs", json={"recipe": "numbers", "inputs": {"n": 2}})
        parent = made.json()["run_id"]
        client.post(f"/runs/{parent}/cancel")
        answers = [
            client.post(
                f"/runs/{parent}/rerun",
                json={"from_step": "a", "inputs": {"n": 3}},
                headers={"Idempotency-Key": "retry-me"},
            )
            for _ in range(5)
        ]
        assert [a.status_code for a in answers] == [201] * 5
        assert len({a.json()["run_id"] for a in answers}) == 1
        assert [a.json()["created"] for a in answers] == [True, False, False, False, False]
        body_key = client.post(
            f"/runs/{parent}/rerun",
            json={"from_step": "a", "inputs": {"n": 3}, "idempotency_key": "retry-me"},
        )
        assert body_key.json()["run_id"] == answers[0].json()["run_id"]
        assert children(client, parent) == [answers[0].json()["run_id"]]
        other = client.post(
            f"/runs/{parent}/rerun",
            json={"from_step": "a", "inputs": {"n": 4}},
            headers={"Idempotency-Key": "retry-me"},
        )
        assert (other.status_code, other.json()["error"]["type"]) == (409, "idempotency_conflict")
        both = client.post(
            f"/runs/{parent}/rerun",
            json={"from_step": "a", "idempotency_key": "one"},
            headers={"Idempotency-Key": "two"},
        )
        assert both.status_code == 400, both.text
        assert "Idempotency-Key" in both.json()["error"]["message"]


# -- the step cache: one recipe's answer never serves another ---------------------------------

PRIVATE = """\
id: {id}
model: openai-compatible:fake-model@{url}/v1
steps:
  - {{id: read, goal: "Read secret.txt and say what it says.", tools: [read_file], cache: true}}
"""


def test_a_cached_step_never_answers_another_recipe_with_its_files(
    client: httpx2.Client, folder: Path, url: str
) -> None:
    """Two recipes of the folder with the same cached step (prompt, model, tools): each reads
    its own workspace's secret, and the second is not answered with the first's from the
    cache (before, the key had no recipe or file-tool root)."""
    from minions.testing import FakeOpenAIServer, FakeRequest

    def reader(request: FakeRequest) -> Any:
        last = request.last_message
        if last.get("role") == "tool":
            return str(last.get("content"))
        return [("read_file", {"path": "secret.txt"})]

    outputs = {}
    with FakeOpenAIServer(reader) as model:
        for name in ("alpha", "bravo"):
            recipe_id = f"private-{name}"
            (folder / "recipes" / f"{recipe_id}.yaml").write_text(
                PRIVATE.format(id=recipe_id, url=model.url)
            )
            workspace = folder / ".minions" / "workspace" / recipe_id
            workspace.mkdir(parents=True, exist_ok=True)
            (workspace / "secret.txt").write_text(f"{name}'s password")
        with worker(url, folder, "cache-worker", folder / "ledger.txt"):
            for name in ("alpha", "bravo"):
                made = client.post("/runs", json={"recipe": f"private-{name}"})
                assert made.status_code == 201, made.text
                run_id = made.json()["run_id"]
                with client.stream("GET", f"/runs/{run_id}/events/stream") as response:
                    kinds = [m["event"] for m in read_stream(response)]
                assert kinds[-1] == "run_completed", kinds
                assert "step_cached" not in kinds
                outputs[name] = client.get(f"/runs/{run_id}").json()["output"]
    assert outputs == {"alpha": "alpha's password", "bravo": "bravo's password"}


# -- bad bytes ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def store_api(request: Any, folder: Path, api: ServerProcess) -> Iterator[ServerProcess]:
    """An API process on SQLite (the one above) and on Postgres."""
    if request.param == "sqlite":
        yield api
        return
    with cluster() as postgres:
        url = fresh_database(postgres, "hostile")
        with server(folder, url, "--no-worker", "--recipes", str(folder / "recipes")) as pg:
            yield pg


@pytest.mark.parametrize(
    ("method", "target", "headers", "body", "status", "names"),
    [pytest.param(*rest, id=name) for name, *rest in BAD_INPUTS],
)
def test_bad_bytes_are_refused_naming_the_field(
    store_api: ServerProcess,
    method: str,
    target: str,
    headers: dict[str, bytes],
    body: bytes,
    status: int,
    names: str,
) -> None:
    import json

    got, answer = raw_request(store_api.port, method, target, headers, body)
    assert got == status, answer
    error = json.loads(answer)["error"]
    assert names in error["message"], error
    assert set(error) <= {"type", "message"}


# -- schedules ----------------------------------------------------------------------------------

SCHEDULE_ATTACKS = [
    # (name, body over {"recipe": "ledger", "inputs": {"tag": "h"}}, status, what the message names)
    ("every-beyond-int64", {"every": "9" * 40 + "d"}, 400, "every"),
    ("every-past-ten-years", {"every": "3651d"}, 400, "every"),
    ("every-float-overflow", {"every": "1e400"}, 400, "every"),
    ("every-inf", {"every": "inf"}, 400, "every"),
    ("every-nan", {"every": "NaN"}, 400, "every"),
    ("every-negative", {"every": "-1s"}, 400, "every"),
    ("every-zero", {"every": "0s"}, 400, "every"),
    ("every-fraction", {"every": "0.5"}, 400, "every"),
    ("every-a-number", {"every": 10**30}, 422, "every"),
    ("every-sum-overflow", {"every": "3000d3000d"}, 400, "every"),
    ("every-too-long-text", {"every": "1s" * 60}, 422, "every"),
    ("cron-and-every", {"every": "1h", "cron": "* * * * *"}, 400, "either"),
    ("cron-feb-30", {"cron": "0 0 30 2 *"}, 400, "cron"),
    ("cron-seconds-field-huge", {"cron": "* * * * * " + "9" * 30}, 400, "cron"),
    ("cron-step-zero", {"cron": "*/0 * * * *"}, 400, "cron"),
    ("cron-year-range", {"cron": "0 0 1 1-9999 *"}, 400, "cron"),
    ("timezone-path", {"every": "1h", "timezone": "../../../etc/passwd"}, 400, "timezone"),
    ("timezone-nul", {"cron": "0 7 * * *", "timezone": "Europe/Paris\u0000"}, 400, "timezone"),
    ("overlap-unknown", {"every": "1h", "overlap": "queue_all"}, 422, "overlap"),
    ("catch-up-unknown", {"every": "1h", "catch_up": "some"}, 422, "catch_up"),
    ("name-traversal", {"every": "1h", "name": "../../x"}, 400, "name"),
]


@pytest.mark.parametrize(
    ("body", "status", "names"),
    [pytest.param(body, status, names, id=name) for name, body, status, names in SCHEDULE_ATTACKS],
)
def test_a_schedule_attack_is_a_clear_4xx(
    store_api: ServerProcess, body: dict[str, Any], status: int, names: str
) -> None:
    """Intervals too long for the store's integers or floats, cron expressions that never
    fire or overflow, zones that are paths, unknown policies: a 400 or 422 naming the field,
    never a 500, on SQLite and Postgres."""
    with httpx2.Client(base_url=store_api.base, headers=auth(), timeout=60) as client:
        answer = client.post(
            "/schedules", json={"recipe": "ledger", "inputs": {"tag": "h"}, **body}
        )
        assert answer.status_code == status, answer.text
        assert names in answer.json()["error"]["message"], answer.text
        assert client.get("/schedules").status_code == 200


def test_the_longest_interval_and_each_overlap_are_stored(store_api: ServerProcess) -> None:
    with httpx2.Client(base_url=store_api.base, headers=auth(), timeout=60) as client:
        for overlap in ("skip", "buffer_one", "allow"):
            made = client.post(
                "/schedules",
                json={
                    "recipe": "ledger",
                    "inputs": {"tag": "h"},
                    "every": "3650d",
                    "name": f"decade-{overlap}",
                    "overlap": overlap,
                    "replace": True,
                },
            )
            assert made.status_code == 201, made.text
            got = made.json()
            assert (got["every"], got["overlap"], got["late"], got["late_slots"]) == (
                3650 * 86400,
                overlap,
                False,
                0,
            )
        default = client.post(
            "/schedules",
            json={"recipe": "ledger", "inputs": {"tag": "h"}, "every": "1h", "replace": True},
        )
        assert default.json()["overlap"] == "skip"
        listed = {s["name"]: s for s in client.get("/schedules").json()}
        assert listed["decade-buffer_one"]["overlap"] == "buffer_one"
        assert listed["decade-skip"]["late_reason"] is None


# -- limits and endpoint lessons: what one client's runs may do to everyone's ------------------

LIMITED = """\
id: limited
inputs: {tag: {type: string}}
steps:
  - {id: ask, goal: "say {{ inputs.tag }}"}
"""
SHAPED = """\
id: shaped
inputs: {tag: {type: string}}
steps:
  - id: ask
    goal: "the total for {{ inputs.tag }}"
    output: {total: 0}
"""
HOSTILE_RETRY_AFTER = {
    "t-inf": "inf",
    "t-nan": "NaN",
    "t-negative": "-1",
    "t-overflow": "1e309",
    "t-garbage": "tomorrow-ish",
    "t-long": "9" * 400,
    "t-bad-date": "Sun, 99 Foo 2024 99:99:99 GMT",
}
"""Retry-After values no pause may take: each run's first call is answered 429 with one."""
PAUSING = {"t-day": "86400", "t-far-date": "Fri, 31 Dec 9999 23:59:59 GMT"}
"""Retry-After values that ask for a day, or for ever."""


def settled(store_url: str, run_id: str, within: float = 90) -> str:
    """The run's status once it ended (or what it is after `within` seconds)."""
    import asyncio
    import time

    from minions.runs import RunStore

    store = RunStore(store_url)
    try:
        deadline = time.monotonic() + within
        while True:
            status = asyncio.run(store.get(run_id)).status
            if status in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
                return status
            time.sleep(0.1)
    finally:
        store.close()


def operator(store_url: str, *args: str) -> Any:
    from typer.testing import CliRunner

    from minions.cli._app import app

    return CliRunner().invoke(app, [*args, "--database-url", store_url])


def test_a_clients_429s_cannot_freeze_an_endpoint_for_everyone(tmp_path: Path) -> None:
    """Runs of one client whose model answers 429 with a hostile ``Retry-After`` (infinite,
    NaN, negative, garbage, a day, a date in year 9999): nonsense pauses nobody, a day pauses
    every run for the limits' `max_pause` only, the pause names the run that set it, and
    `minions endpoints forget` lifts it for the other clients' runs."""
    import json
    import threading

    from minions.runs import RunStore
    from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "limited.yaml").write_text(LIMITED)
    refused: set[str] = set()
    lock = threading.Lock()

    def reply(request: FakeRequest) -> FakeReply:
        said = json.dumps(request.messages)
        with lock:
            for tag, header in {**HOSTILE_RETRY_AFTER, **PAUSING}.items():
                if tag in said and tag not in refused:
                    refused.add(tag)
                    return FakeReply.failure(429, "slow down", headers={"Retry-After": header})
        return FakeReply.text("ok")

    store_url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    with FakeOpenAIServer(reply) as model:
        limits = tmp_path / "limits.yaml"
        limits.write_text(
            f"endpoints: [{{match: '{model.url}', max_concurrent: 8}}]\nmax_pause: 20s\n"
        )
        env = {
            "MINIONS_MODEL": f"openai-compatible:fake-model@{model.url}",
            "OPENAI_API_KEY": "sk-test",
        }
        with (
            # Only the limited worker runs them (the API's own worker has no limits).
            server(tmp_path, store_url, "--recipes", str(recipes), "--no-worker", **env) as api,
            worker(store_url, recipes, "w1", tmp_path / "ledger", "--limits", str(limits), **env),
            httpx2.Client(base_url=api.base, headers=auth(), timeout=30) as client,
        ):
            runs = {tag: submit(client, "limited", tag=tag) for tag in HOSTILE_RETRY_AFTER}
            assert {tag: settled(store_url, r) for tag, r in runs.items()} == dict.fromkeys(
                runs, "completed"
            )
            assert refused == set(HOSTILE_RETRY_AFTER)
            store = RunStore(store_url)
            try:
                assert asyncio_run(store.pauses()) == []
                for tag in PAUSING:
                    by = submit(client, "limited", tag=tag)
                    pause = until_paused(store, by)
                    assert pause.paused_at is not None
                    assert pause.until - pause.paused_at <= 20.0
                    assert pause.asked is not None
                    assert pause.asked > 3600
                    listed = operator(store_url, "endpoints", "list", "--json")
                    assert by in [p["paused_by"] for p in json.loads(listed.stdout)["pauses"]]
                    forgot = operator(store_url, "endpoints", "forget", model.url)
                    assert "lifted 1 pause" in forgot.stderr, forgot.output
                    assert asyncio_run(store.pauses()) == []
                    # Another client's run goes at once: nothing holds the endpoint.
                    other = submit(client, "limited", tag=f"other-{tag}")
                    assert settled(store_url, other, within=15) == "completed"
            finally:
                store.close()


def asyncio_run(awaitable: Any) -> Any:
    import asyncio

    return asyncio.run(awaitable)


def until_paused(store: Any, run_id: str, within: float = 60) -> Any:
    """The pause `run_id` set, once it is in the store."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = [p for p in asyncio_run(store.pauses()) if p.paused_by == run_id]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} set no pause")


def test_one_clients_prose_does_not_demote_json_schema_for_the_others(tmp_path: Path) -> None:
    """A client whose prompt makes the model answer prose (twice in a row) demotes
    ``json_schema`` for its own run: the other clients' runs still ask for it, and the store
    keeps no lesson of it (one run is no evidence)."""
    import json

    from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "shaped.yaml").write_text(SHAPED)
    native: list[tuple[str, bool]] = []

    def reply(request: FakeRequest) -> FakeReply:
        said = json.dumps(request.messages)
        tag = "prose-please" if "prose-please" in said else "fair"
        native.append((tag, request.response_format is not None))
        if tag == "prose-please" and request.response_format is not None:
            return FakeReply.text("The total is five, more or less.")
        return FakeReply.structured({"total": 5})

    store_url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    with FakeOpenAIServer(reply) as model:
        limits = tmp_path / "limits.yaml"
        limits.write_text(f"endpoints: [{{match: '{model.url}', max_concurrent: 8}}]\n")
        env = {
            "MINIONS_MODEL": f"openai-compatible:fake-model@{model.url}",
            "OPENAI_API_KEY": "sk-test",
        }
        with (
            server(tmp_path, store_url, "--recipes", str(recipes), **env) as api,
            worker(store_url, recipes, "w1", tmp_path / "ledger", "--limits", str(limits), **env),
            httpx2.Client(base_url=api.base, headers=auth(), timeout=30) as client,
        ):
            attacker = submit(client, "shaped", tag="prose-please")
            assert settled(store_url, attacker) == "completed"
            fair = submit(client, "shaped", tag="fair")
            assert settled(store_url, fair) == "completed"
    assert native == [
        ("prose-please", True),
        ("prose-please", True),
        ("prose-please", False),  # demoted, for this run
        ("fair", True),  # the next client's run asks for json_schema still
    ]
    listed = operator(store_url, "endpoints", "list", "--json")
    lessons = [e["rejected"] for e in json.loads(listed.stdout)["endpoints"]]
    assert all("json_schema" not in rejected for rejected in lessons)
