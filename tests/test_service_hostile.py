"""`minions serve` as an attacker finds it: real server processes on 127.0.0.1 (an API that
takes inline recipes and runs nothing, and a `minions worker` beside it on the same store),
each attack a test.

Inline recipes try to make the server import code, read or write files, or reach hosts of
their choosing, with fresh ids and paths (absolute, ``..``, ``/proc/self``, a symbolically
linked folder, Windows-style, URL-encoded, a module written after the server started): every
one is refused naming the field, no module outside the recipes folder is imported (each
would write a marker), none is imported by the API process (only by the worker), and no file
outside the runs' workspace changes. Requests with bytes no client should send are 400s
naming the field, the same on SQLite and Postgres."""

from __future__ import annotations

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
