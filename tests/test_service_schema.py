"""schemathesis against the service's `/openapi.json`: generated requests (valid and not) to
every endpoint get no 5xx, and every response matches the schema (status code, content type,
body). Bounded: a few examples per operation, on a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
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


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("schema")
    config = ServiceConfig(
        token=TOKEN,
        database_url=f"sqlite:///{folder / 'store' / 'minions.db'}",
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
                checks=[
                    not_a_server_error,
                    status_code_conformance,
                    content_type_conformance,
                    response_schema_conformance,
                ],
            )

        try:
            answers()
        except Unsatisfiable:
            # No invalid request exists for an operation that takes nothing.
            assert mode is GenerationMode.NEGATIVE
            assert operation.label in ("GET /recipes", "GET /workers", "GET /health")
        checked.append(operation.label)
    assert len(checked) == 11  # every operation of the schema
