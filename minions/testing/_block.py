"""`block_real_models()`: forbid real model requests in tests."""

from __future__ import annotations

from collections.abc import Iterable

from minions.models._internal import ModelBlock, model_block

__all__ = ["ModelBlock", "block_real_models"]


def block_real_models(*, allow: Iterable[str] = ()) -> ModelBlock:
    """Forbid real model requests inside a ``with`` block.

    Inside it, a request to a model behind a server (`OpenAIChatModel`, a model string, the
    `MINIONS_MODEL` a step or run falls back to, or any model whose `endpoint` names a server)
    raises `ModelError` naming the model and its endpoint; the step it belongs to fails with
    that reason, and its `blocked` list says what was refused. Test doubles (`TestModel`,
    `ScriptedModel`, `FunctionModel`), `ReplayModel` and the running `FakeOpenAIServer`s
    answer as usual.

    It holds for the code in the block and the tasks and threads it starts (`asyncio` tasks,
    `asyncio.to_thread`, `execute_sync`), not for concurrent tasks that did not enter it, and
    nothing of it is left after the block. Blocks nest; an inner one allows what the outer one
    allows, and more.

    Args:
        allow: base URLs still allowed (``http://127.0.0.1:8080/v1``), with what follows them.

    Example::

        with block_real_models() as block:
            result = executor.execute_sync(recipe)
        assert block.blocked == []

    The pytest fixture of the same name does this for one test, and fails the test when a
    request was blocked (see docs/testing.md).
    """
    return model_block(allow)
