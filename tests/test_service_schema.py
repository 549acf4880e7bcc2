"""schemathesis against the service's `/openapi.json`: generated requests (valid and not) to
every endpoint get no 5xx, and every response matches the schema (status code, content type,
body); so do sequences following the schema's links from a submitted run (get it, read its
events, cancel, resume, get a stream ticket), and arbitrary bytes in the `Last-Event-ID`
header. Bounded: a few examples per operation, on a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from service_helpers import TOKEN, app_in_thread, auth, write_recipes

from minions.service import ServiceConfig, create_app

pytestmark = pytest.mark.slow

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


VIEWER: dict[str, str] = {}
"""The key of a viewer of the module's server (made with it), and (``two``) of an operator of
two projects."""


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import asyncio

    from minions.runs import RunStore

    folder = tmp_path_factory.mktemp("schema")
    url = f"sqlite:///{folder / 'store' / 'minions.db'}"

    async def keys() -> dict[str, str]:
        store = RunStore(url, create=True)
        key = (await store.add_key("viv", role="viewer")).key
        two = (await store.add_key("two", role="operator", projects=["team-a", "team-b"])).key
        await store.aclose()
        return {"key": key, "two": two}

    VIEWER.update(asyncio.run(keys()))
    config = ServiceConfig(
        token=TOKEN,
        database_url=url,
        recipes=write_recipes(folder / "recipes"),
        allow_inline_recipes=True,
    )
    with app_in_thread(create_app(config)) as base:
        yield base


def operations(base_url: str) -> list[Any]:
    from schemathesis.core.result import Ok

    document = httpx2.get(f"{base_url}/openapi.json", headers=auth()).json()
    found = []
    for result in schemathesis.openapi.from_dict(document).get_all_operations():
        assert isinstance(result, Ok), result  # the schema is valid
        found.append(result.ok())
    return found


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_generated_requests_get_no_5xx_and_answers_match_the_schema(
    base_url: str, mode: GenerationMode
) -> None:
    checked = []
    for operation in operations(base_url):

        @given(case=operation.as_strategy(mode))
        @settings(
            max_examples=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )
        def answers(case: Any) -> None:
            case.call_and_validate(
                base_url=base_url,
                headers={**(case.headers or {}), **auth()},
                timeout=30,
                checks=CHECKS,
            )

        try:
            answers()
        except Unsatisfiable:
            # No invalid request exists for an operation that takes nothing.
            assert mode is GenerationMode.NEGATIVE
            assert operation.label in (
                "GET /recipes", "GET /workers", "GET /health", "GET /schedules",
                "GET /health/live", "GET /health/ready",
            )  # fmt: skip
        checked.append(operation.label)
    assert len(checked) == 37  # every operation of the schema


def test_generated_requests_of_a_viewer_get_403s_not_5xx(base_url: str) -> None:
    """A viewer's generated requests: the operations it may not do are 403s that match the
    schema, the others answer as for anyone."""
    refused = set()
    for operation in operations(base_url):

        @given(case=operation.as_strategy(GenerationMode.POSITIVE))
        @settings(
            max_examples=4,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )
        def answers(case: Any) -> None:
            response = case.call_and_validate(
                base_url=base_url,
                headers={**(case.headers or {}), **auth(VIEWER["key"])},
                timeout=30,
                checks=CHECKS,
            )
            if response.status_code == 403:
                refused.add(case.operation.label)

        answers()
    assert refused >= {"POST /runs", "POST /keys", "DELETE /keys/{name}", "POST /schedules"}
    assert not {label for label in refused if label.startswith("GET ")} - {
        "GET /keys",
        "GET /audit",
    }


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_generated_requests_of_a_key_of_two_projects_get_no_5xx(
    base_url: str, mode: GenerationMode
) -> None:
    """An operator of two projects: a submission naming none of them is a 400, one naming
    another project a 404, the ids of runs of other projects 404s; every answer within the
    schema, none a 5xx."""
    seen: set[tuple[str, int]] = set()
    for operation in operations(base_url):

        @given(case=operation.as_strategy(mode))
        @settings(
            max_examples=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )
        def answers(case: Any) -> None:
            response = case.call_and_validate(
                base_url=base_url,
                headers={**(case.headers or {}), **auth(VIEWER["two"])},
                timeout=30,
                checks=CHECKS,
            )
            seen.add((case.operation.label, response.status_code))

        try:
            answers()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE
    if mode is GenerationMode.POSITIVE:
        assert {("POST /runs", 400), ("POST /runs", 404)} & seen
        assert ("GET /runs/{run_id}", 404) in seen


def test_any_bytes_in_authorization_get_a_401(base_url: str) -> None:
    with httpx2.Client(base_url=base_url, timeout=30) as client:  # one connection for all

        @given(value=HEADER_BYTES, scheme=st.sampled_from([b"Bearer ", b"bearer mk_", b""]))
        @settings(max_examples=150, deadline=None, database=None, derandomize=True)
        def answers(value: bytes, scheme: bytes) -> None:
            response = client.get("/runs", headers=[(b"Authorization", scheme + value)])
            assert response.status_code == 401, (scheme, value, response.text)

        answers()


def test_sequences_along_the_schemas_links_get_no_5xx(base_url: str) -> None:
    document = httpx2.get(f"{base_url}/openapi.json", headers=auth()).json()
    links = document["paths"]["/runs"]["post"]["responses"]["201"]["links"]
    # get, events, cancel, resume, rerun, its preview, ticket, the steps, a step
    assert len(links) == 9
    # Sequences of the runs' operations (the others have no links; the test above fuzzes them).
    runs_only = {p: v for p, v in document["paths"].items() if p.startswith("/runs")}
    machine = schemathesis.openapi.from_dict({**document, "paths": runs_only}).as_state_machine()
    followed: set[tuple[str, str, int]] = set()

    class Sequences(machine):  # type: ignore[misc, valid-type]
        def before_call(self, case: Any) -> None:
            if case.method == "POST" and case.path == "/runs":
                # A run that exists, for the linked operations to work on (random bodies
                # are the test above's).
                case.body = {"recipe": "ledger", "inputs": {"tag": "linked"}}

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": base_url, "headers": auth(), "timeout": 30}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS)
            followed.add((case.method, case.path, response.status_code))

    Sequences.run(
        settings=settings(
            max_examples=25,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )
    )
    # The links were followed: operations on a run that exists answered.
    assert {("GET", "/runs/{run_id}", 200), ("POST", "/runs/{run_id}/cancel", 200)} <= followed


HEADER_BYTES = st.one_of(
    st.integers(min_value=0, max_value=10**25).map(lambda n: str(n).encode()),
    st.binary(min_size=1, max_size=30).filter(
        lambda b: min(b) >= 0x20 and 0x7F not in b and b.strip() == b
    ),
)
"""What h11 lets a client send in a header value (printable bytes, obs-text included), and
numbers of every size."""


def test_any_bytes_in_last_event_id_get_an_answer(base_url: str) -> None:
    with httpx2.Client(base_url=base_url, headers=auth(), timeout=30) as client:
        made = client.post("/runs", json={"recipe": "ledger", "inputs": {"tag": "ended"}})
        run_id = made.json()["run_id"]
        assert client.post(f"/runs/{run_id}/cancel").status_code == 200  # it has ended

        @given(value=HEADER_BYTES)
        @settings(max_examples=150, deadline=None, database=None, derandomize=True)
        def answers(value: bytes) -> None:
            path = f"/runs/{run_id}/events/stream"
            response = client.get(path, headers=[(b"Last-Event-ID", value)])
            sequence = value.isdigit() and len(value) <= 19 and int(value) <= 2**62
            expected = (200 if int(value) == 0 else 204) if sequence else 400
            assert response.status_code == expected, value

        answers()
