"""The pytest plugin of minions (registered as the ``minions`` ``pytest11`` entry point).

* The ``block_real_models`` fixture: the test runs inside `block_real_models()`, and fails
  (at teardown) if a real model request was blocked, even one the code under test caught.
  A test that means to be refused empties ``block_real_models.blocked``.
* The ``minions_block_real_models`` ini option (``true``): every test runs so, as if it
  asked for the fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from minions.models._internal import ModelBlock

__all__: list[str] = []

_INI = "minions_block_real_models"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        _INI,
        type="bool",
        default=False,
        help="run every test inside minions.testing.block_real_models() (no real model calls)",
    )


def _blocked(request: pytest.FixtureRequest) -> Iterator[ModelBlock]:
    from minions.testing._block import block_real_models

    with block_real_models() as block:
        yield block
    if block.blocked:
        count = len(block.blocked)
        pytest.fail(
            f"{request.node.nodeid}: {count} real model request{'s' if count > 1 else ''} "
            f"blocked: {'; '.join(block.blocked)}. Give the code a test double (TestModel, "
            "ScriptedModel...), or allow the endpoint",
            pytrace=False,
        )


@pytest.fixture(name="block_real_models")
def block_real_models_fixture(request: pytest.FixtureRequest) -> Iterator[ModelBlock]:
    """The test runs inside `minions.testing.block_real_models()`; it fails if a real model
    request was blocked (empty ``.blocked`` to say that was meant)."""
    yield from _blocked(request)


@pytest.fixture(autouse=True)
def _minions_block_real_models(request: pytest.FixtureRequest) -> Iterator[None]:
    if "block_real_models" in request.fixturenames or not request.config.getini(_INI):
        yield
        return
    for _ in _blocked(request):
        yield
