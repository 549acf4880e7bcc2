"""The deployment files (Dockerfile, compose.yaml, the systemd units, the Kubernetes snippets)
exercised on this machine: the commands and environment they name are run as they are
(against a throwaway Postgres or SQLite store, on 127.0.0.1 and a free port), answer their
health check, run a run, and stop cleanly on SIGTERM. An image cannot be built here (no base
image to pull): the Dockerfile is checked to name files, an extra and a user that exist.
Workers find each run's recipe by its id under their recipes root, not at the path it had on
the host that submitted it."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from runs_helpers import (
    WORKER_ENV,
    finished,
    ledger_lines,
    minions,
    stop_process,
    write_ledger_recipe,
)

from minions.runs import RunStore

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
TOKEN = "deploy-test-token"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the files -------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return loaded


def minions_services() -> dict[str, dict[str, Any]]:
    """The services of compose.yaml that run the minions image."""
    return {
        name: service
        for name, service in compose()["services"].items()
        if service.get("image") == "minions:local"
    }


def interpolated(value: object, env: Mapping[str, str]) -> str:
    """A compose value with its ``${NAME:-default}`` and ``${NAME:?message}`` filled from
    `env`, as compose does."""

    def one(match: re.Match[str]) -> str:
        name, how, rest = match[1], match[2], match[3]
        given = env.get(name, "")
        if how == ":?":
            assert given, f"compose needs {name}: {rest}"
        return given or (rest if how == ":-" else "")

    return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", one, str(value))


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions (continued lines joined), comments left out."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def unit(name: str) -> dict[str, list[str]]:
    """A systemd unit's settings (every value of each key, in order)."""
    settings: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def test_the_dockerfile_names_what_exists() -> None:
    instructions = dockerfile()
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    copied = [rest for word, rest in instructions if word == "COPY" and "--from" not in rest]
    assert copied
    for rest in copied:
        *sources, _ = shlex.split(rest)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source not in ignored, source
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    runs = " ".join(rest for word, rest in instructions if word == "RUN")
    installed = re.findall(r"\[(\w+)\]", runs)
    assert installed == ["service"]
    assert "service" in extras
    users = [rest for word, rest in instructions if word == "USER"]
    assert users
    assert users[-1] not in ("root", "0")
    assert "useradd --system --uid 10001 --user-group --home-dir /srv/minions" in runs
    entry = [rest for word, rest in instructions if word == "ENTRYPOINT"]
    assert entry == ['["minions"]']
    # The image's default command is the API of compose.yaml.
    cmd = [rest for word, rest in instructions if word == "CMD"]
    assert yaml.safe_load(cmd[-1]) == minions_services()["api"]["command"]
    # Its recipes root is compose's, and the folder is made in the image.
    env = [rest for word, rest in instructions if word == "ENV"]
    assert "MINIONS_RECIPES=/srv/minions/recipes" in env
    assert "mkdir -p /srv/minions/recipes" in runs


def kubernetes_container(name: str) -> dict[str, Any]:
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "minions.yaml").read_text()))
    deployment = next(d for d in documents if d["metadata"]["name"] == name)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = container
    return found


def test_the_kubernetes_probes_ask_live_and_ready() -> None:
    """The API's and the workers' liveness probes ask /health/live, their readiness probes
    /health/ready, on the port each serves them (a worker's --health-port, on every
    interface so that the kubelet reaches it)."""
    api = kubernetes_container("minions-api")
    assert api["args"] == minions_services()["api"]["command"]
    worker = kubernetes_container("minions-worker")
    args = worker["args"]
    assert args[args.index("--health-host") + 1] == "0.0.0.0"
    worker_port = int(args[args.index("--health-port") + 1])
    for container, port in ((api, 8000), (worker, worker_port)):
        assert container["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": port}
        assert container["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": port}
        assert [p["containerPort"] for p in container["ports"]] == [port]


def test_the_platforms_wait_longer_than_a_worker_drains() -> None:
    """SIGKILL comes after a worker's drain (its grace, and about 10 s to hand its runs
    back): Kubernetes' terminationGracePeriodSeconds and Compose's stop_grace_period."""
    documents = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "minions.yaml").read_text()))
    deployment = next(d for d in documents if d["metadata"]["name"] == "minions-worker")
    args = kubernetes_container("minions-worker")["args"]
    grace = float(args[args.index("--grace") + 1])
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= grace + 10
    for name, service in minions_services().items():
        if name.startswith("worker"):
            grace = float(compose()["x-minions-env"]["MINIONS_WORKER_GRACE"])
            assert service["stop_signal"] == "SIGTERM"
            assert int(service["stop_grace_period"].removesuffix("s")) >= grace + 10


def test_the_kubernetes_worker_answers_its_probes(tmp_path: Path) -> None:
    """The snippet's worker command (bound to 127.0.0.1 and a free port here) answers
    /health/live and /health/ready once it takes runs; SIGTERM stops it cleanly."""
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    ports = Ports()
    command = local(kubernetes_container("minions-worker")["args"], _free_port(), ports)
    port = ports.given["--health-port"]
    log = tmp_path / "worker.log"
    env = {"MINIONS_DATABASE_URL": url, "MINIONS_RECIPES": str(recipes)}
    with started(command, env, tmp_path, log) as worker:
        wait_for_line(log, "running queued runs", worker)
        live = httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=10)
        assert (live.status_code, live.json()["status"]) == (200, "ok")
        ready = httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=10)
        assert (ready.status_code, ready.json()) == (200, {"status": "ok", "reason": None})
        stopped(worker, log)


# -- running what they name ------------------------------------------------------------------


@contextmanager
def started(
    command: Sequence[str], env: Mapping[str, str], cwd: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`minions` with `command`'s arguments, as the file names them; stopped by SIGTERM at
    the end, where it must exit 0 by itself."""
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "minions", *command],
            env={**os.environ, **WORKER_ENV, **env},
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    except BaseException:
        print(f"--- {log.name}:\n{log.read_text()[-3000:]}")
        raise
    finally:
        stop_process(process)


def stopped(process: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM: the process exits 0 by itself, saying nothing alarming."""
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "Task was destroyed" not in text, text[-3000:]


def wait_for_line(log: Path, line: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while line not in log.read_text():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def healthy(
    check: Sequence[str], port: int, process: subprocess.Popen[bytes], *, given: int = 8000
) -> None:
    """The health check (its command, with the test's port for the file's `given` one)
    passes once the process is ready."""
    argv = [
        sys.executable if a == "python" else a.replace(f":{given}/", f":{port}/") for a in check
    ]
    deadline = time.monotonic() + 60
    while subprocess.run(argv, capture_output=True, timeout=30).returncode != 0:
        assert process.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.1)


class Ports:
    """The free ports `local` gave a command's port options, by option."""

    def __init__(self) -> None:
        self.given: dict[str, int] = {}


def local(command: list[str], port: int, ports: Ports | None = None) -> list[str]:
    """The command bound to 127.0.0.1 and a free port (tests bind nothing else): `port` for
    --port, a free one of its own for --health-port (said in `ports`)."""
    changed = list(command)
    for option in ("--host", "--health-host"):
        if option in changed:
            changed[changed.index(option) + 1] = "127.0.0.1"
    if "--port" in changed:
        changed[changed.index("--port") + 1] = str(port)
    if "--health-port" in changed:
        free = _free_port()
        changed[changed.index("--health-port") + 1] = str(free)
        if ports is not None:
            ports.given["--health-port"] = free
    return changed


def run_through_the_api(port: int, url: str) -> None:
    """A run submitted by id to the API is run by a worker to its end."""
    response = httpx.post(
        f"http://127.0.0.1:{port}/runs",
        json={"recipe": "ledger", "inputs": {"tag": "deployed"}},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    run_id = response.json()["run_id"]

    async def wait() -> str:
        async with RunStore(url) as store:
            return await finished(store, run_id)

    assert asyncio.run(wait()) == "completed"


@pytest.mark.slow
def test_the_compose_fleet_runs_here(tmp_path: Path, postgres: str) -> None:
    """compose.yaml's API and two workers, with their commands and environment, on a
    throwaway Postgres: healthy, a run by id, and a clean stop of each by SIGTERM."""
    from postgres import fresh_database

    url = fresh_database(postgres, "compose")
    recipes = tmp_path / "srv-recipes"
    write_ledger_recipe(recipes / "ledger")
    ledger = tmp_path / "ledger.txt"
    services = minions_services()
    assert set(services) == {"api", "worker-1", "worker-2"}
    assert sorted(compose()["services"]["model"]["profiles"]) == ["local-model"]
    port = _free_port()
    with ExitStack() as stack:
        running = {}
        for name, service in services.items():
            given = {"MINIONS_API_TOKEN": TOKEN}
            env = {k: interpolated(v, given) for k, v in service["environment"].items()}
            assert env["MINIONS_DATABASE_URL"].startswith("postgresql://")
            assert env["MINIONS_RECIPES"] == "/srv/minions/recipes"
            volume = service["volumes"][0]
            assert volume.endswith(":/srv/minions/recipes:ro")
            env.update(
                MINIONS_DATABASE_URL=url,
                MINIONS_RECIPES=str(recipes),
                LEDGER=str(ledger),
            )
            log = tmp_path / f"{name}.log"
            ports = Ports()
            command = local(service["command"], port, ports)
            process = stack.enter_context(started(command, env, tmp_path, log))
            running[name] = (process, log, ports)
        api = running["api"][0]
        healthy(services["api"]["healthcheck"]["test"][1:], port, api)
        for name in ("worker-1", "worker-2"):
            process, log, ports = running[name]
            wait_for_line(log, "running queued runs", process)
            # Each worker's health check asks its own --health-port's /health/ready.
            check = services[name]["healthcheck"]["test"][1:]
            assert any(":8001/health/ready" in word for word in check)
            assert services[name]["command"][-2:] == ["--health-port", "8001"]
            healthy(check, ports.given["--health-port"], process, given=8001)
        run_through_the_api(port, url)
        assert len(ledger_lines(ledger)) == 5
        for process, log, _ in running.values():
            stopped(process, log)


def test_the_systemd_units_run_here(tmp_path: Path) -> None:
    """The units' ExecStart and environment file, on a throwaway SQLite store: the API
    answers its health check, two workers of the template run a run, SIGTERM stops each
    cleanly (the units' KillSignal)."""
    api_unit = unit("minions-api.service")
    worker_unit = unit("minions-worker@.service")
    env = env_file(DEPLOY / "systemd" / "minions.env")
    for settings in (api_unit, worker_unit):
        assert settings["EnvironmentFile"] == ["/etc/minions/minions.env"]
        assert settings["KillSignal"] == ["SIGTERM"]
        assert settings["User"] == ["minions"]
        assert settings["ReadWritePaths"] == settings["WorkingDirectory"]
    assert set(env) >= {"MINIONS_DATABASE_URL", "MINIONS_RECIPES", "MINIONS_API_TOKEN"}
    # systemd's SIGKILL comes after the worker's drain: its grace and time to hand back.
    (exec_start,) = worker_unit["ExecStart"]
    words = exec_start.split()
    grace = float(words[words.index("--grace") + 1])
    assert float(worker_unit["TimeoutStopSec"][0]) >= grace + 10
    recipes = tmp_path / "recipes"
    write_ledger_recipe(recipes / "ledger")
    ledger = tmp_path / "ledger.txt"
    url = f"sqlite:///{tmp_path / 'store' / 'minions.db'}"
    env.update(
        MINIONS_DATABASE_URL=url,
        MINIONS_RECIPES=str(recipes),
        MINIONS_API_TOKEN=TOKEN,
        LEDGER=str(ledger),
    )
    port = _free_port()

    def argv(settings: dict[str, list[str]], instance: str = "") -> list[str]:
        (line,) = settings["ExecStart"]
        words = shlex.split(line.replace("%H", socket.gethostname()).replace("%i", instance))
        assert words[0] == "/opt/minions/venv/bin/minions"
        return local(words[1:], port)

    with ExitStack() as stack:
        api_log = tmp_path / "api.log"
        api = stack.enter_context(started(argv(api_unit), env, tmp_path, api_log))
        workers = []
        for instance in ("1", "2"):
            log = tmp_path / f"worker-{instance}.log"
            command = argv(worker_unit, instance)
            assert command[-1] == f"{socket.gethostname()}-{instance}"
            workers.append((stack.enter_context(started(command, env, tmp_path, log)), log))
        check = ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health/ready', timeout=3)"]  # fmt: skip
        healthy(check, port, api)
        assert httpx.get(f"http://127.0.0.1:{port}/health/live").json()["status"] == "ok"
        assert httpx.get(f"http://127.0.0.1:{port}/health").json()["worker"] == "none"
        for process, log in workers:
            wait_for_line(log, "running queued runs", process)
        run_through_the_api(port, url)
        assert len(ledger_lines(ledger)) == 5
        stopped(api, api_log)
        for process, log in workers:
            stopped(process, log)


# -- recipes by id under a root ----------------------------------------------------------------


async def test_a_worker_finds_recipes_by_id_under_its_own_root(tmp_path: Path) -> None:
    """Submitted from one folder, run by a worker whose recipes root is another one (the
    submitter's folder gone): the worker finds the recipe (and its tools module) by its id;
    a run of a recipe its root lacks fails, saying the id and the root."""
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    submitted = write_ledger_recipe(tmp_path / "laptop" / "flows")
    other = tmp_path / "laptop" / "other.yaml"
    other.write_text("id: elsewhere\nsteps:\n  - {id: a, tool: current_datetime}\n")
    async with RunStore(url, create=True) as store:
        run_id, _ = await store.submit(submitted, {"tag": "r1"})
        missing, _ = await store.submit(other)
    root = tmp_path / "host-b" / "recipes"
    shutil.copytree(tmp_path / "laptop" / "flows", root / "team" / "ledger")
    shutil.rmtree(tmp_path / "laptop")  # nothing at the submitter's path any more
    ledger = tmp_path / "ledger.txt"
    log = tmp_path / "worker.log"
    command = ["worker", "--database-url", url, "--executor-id", "b"]
    env = {"LEDGER": str(ledger), "MINIONS_RECIPES": str(root)}
    with started(command, env, tmp_path, log) as worker:
        wait_for_line(log, "running queued runs", worker)
        async with RunStore(url) as store:
            assert await finished(store, run_id) == "completed"
            assert await finished(store, missing) == "failed"
            error = (await store.get(missing)).error
        stopped(worker, log)
    assert [step for _, step, _ in ledger_lines(ledger)] == ["one", "two", "three", "four", "five"]
    assert error is not None
    assert f"no recipe with id 'elsewhere' under the worker's recipes root {str(root)!r}" in error


def test_a_recipes_root_that_is_not_a_folder_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'minions.db'}"
    done = minions("worker", "--database-url", url, MINIONS_RECIPES=str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert "--recipes: no such folder" in done.stderr
    assert "nowhere" in done.stderr
