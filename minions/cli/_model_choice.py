"""Which model a `minions run` uses: `--model`, the recipe's, `MINIONS_MODEL`, or a recording."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions._text import redact_url
from minions.cli._errors import UsageError
from minions.errors import MinionsError
from minions.models import (
    MODEL_ENV,
    FallbackModel,
    Model,
    Recording,
    RecordingModel,
    ReplayModel,
    infer_model,
)
from minions.recipes._internal import recording_beside

if TYPE_CHECKING:
    from minions._step.step import Step
    from minions.recipes import AgentRecipe

__all__ = []

HOW_TO_SET_A_MODEL = f"""\
no model is configured for this recipe. Set one of:
  --model openai:gpt-4o-mini         with OPENAI_API_KEY set
  --model ollama:llama3.2:3b         a local Ollama server (ollama pull llama3.2:3b)
  --model openai-compatible:NAME     with OPENAI_BASE_URL set (vLLM, llama.cpp, LM Studio...)
or put `model:` in the recipe, or set {MODEL_ENV}; `--replay FILE` runs offline from a recording."""


@dataclass(frozen=True, kw_only=True)
class ChosenModel:
    """The model of a run and where it came from.

    Attributes:
        model: the run's default model; ``None`` when no step needs one.
        label: what to call it in messages (``ollama:llama3.2:3b``, ``replay of FILE``).
        replay: the model answering from a recording, when the run replays one.
        recording: where the run records replies (with `--record`).
        note: one line to tell the user (the run replays a recording nobody named).
        resolve: turns the model strings the recipe and its steps name into models.
    """

    model: Model | None
    label: str
    replay: ReplayModel | None = None
    recording: Recording | None = None
    note: str | None = None
    resolve: Callable[[str], Model] = infer_model

    @property
    def resolver(self) -> Callable[[Model | str | None], Model]:
        """The executor's `model_resolver`: for a replay, the replay answers for every model,
        whatever the recipe or a step names (no provider, key or server is needed);
        otherwise every model string goes through `resolve`."""
        replay, resolve = self.replay, self.resolve
        if replay is not None:
            return lambda _spec: replay

        def resolver(spec: Model | str | None) -> Model:
            return resolve(spec) if isinstance(spec, str) else infer_model(spec)

        return resolver

    @property
    def wrapper(self) -> Callable[[Model], Model] | None:
        """The executor's `model_wrapper`: with `--record`, every model the run uses records
        its replies."""
        recording = self.recording
        if recording is None:
            return None
        return lambda model: RecordingModel(model, recording)

    def prepare(self, recipe: AgentRecipe) -> AgentRecipe:
        """The recipe to run: its default model replaced by the chosen one (a replay of a
        fallback stays a fallback: the replay answers for each of its models, in the order the
        recording has their attempts)."""
        if self.replay is not None and isinstance(recipe.model, FallbackModel):
            return recipe
        return dataclasses.replace(recipe, model=self.model)


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """Where the run's model comes from, decided before anything is resolved.

    Attributes:
        spec: the model string, unless the run replays or needs no model.
        origin: where `spec` or `replay` came from, for messages.
        replay: the recording to replay.
    """

    spec: str | None = None
    origin: str = ""
    replay: Path | None = None
    fallback: FallbackModel | None = None
    """The recipe's list of models (`spec` is `None` then)."""

    @property
    def label(self) -> str:
        if self.replay is not None:
            return f"replay of {self.replay}"
        if self.spec is not None:
            return redact_url(self.spec)
        if self.fallback is not None:
            return model_text(self.fallback) or "none"
        return "none"

    @property
    def implicit_replay(self) -> bool:
        return self.replay is not None and self.origin == "beside"


def model_source(
    recipe: AgentRecipe, recipe_path: Path, *, model: str | None, replay: Path | None
) -> ModelSource:
    """Decide where the model comes from: `--replay`, else `--model`, the recipe's `model`,
    `MINIONS_MODEL`, else the recording beside the recipe file, else nowhere.

    Raises:
        UsageError: `--model` and `--replay` are both given.
    """
    if replay is not None:
        if model is not None:
            raise UsageError(
                "--model and --replay cannot be used together: a replay calls no model"
            )
        return ModelSource(origin="--replay", replay=replay)
    if model is not None:
        return ModelSource(spec=model, origin="--model")
    if isinstance(recipe.model, str):
        return ModelSource(spec=recipe.model, origin="the recipe's model")
    if isinstance(recipe.model, FallbackModel):
        return ModelSource(origin="the recipe's model", fallback=recipe.model)
    from_env = os.environ.get(MODEL_ENV) or None
    if from_env is not None:
        return ModelSource(spec=from_env, origin=MODEL_ENV)
    beside = recording_beside(recipe_path)
    if beside.is_file():
        return ModelSource(origin="beside", replay=beside)
    return ModelSource()


def choose_model(
    source: ModelSource,
    recipe: AgentRecipe,
    *,
    record: Path | None,
    resolve: Callable[[str], Model],
    meta: Mapping[str, Any] | None = None,
) -> ChosenModel:
    """Build the run's model from its source.

    Args:
        source: from `model_source`.
        recipe: the loaded recipe (whether a step needs a model at all).
        record: the `--record` option.
        resolve: turns a model string into a `Model` (`minions.models.infer_model`): the
            run's, and each one the recipe or a step names.
        meta: stored in a new recording's metadata.

    Raises:
        UsageError: the options conflict, the model string is not usable, or a step needs a
            model and none is configured.
    """
    if record is not None and source.replay is not None:
        if source.implicit_replay:
            raise UsageError(f"--record needs a real model to record.\n{HOW_TO_SET_A_MODEL}")
        raise UsageError("--record and --replay cannot be used together")
    if source.replay is not None:
        choice = _replay(source.replay)
        if source.implicit_replay:
            note = (
                f"no model set: replaying {source.replay.name}, the recording beside the "
                "recipe (give --model to run live)"
            )
            choice = dataclasses.replace(choice, note=note)
        return choice
    if source.spec is not None or source.fallback is not None:
        chosen = _resolved(source, resolve)
        recording = None
        if record is not None:
            recording = Recording(
                meta={**(meta or {}), "model": source.label, "recorded_at": _now()}
            )
        return ChosenModel(model=chosen, label=source.label, recording=recording, resolve=resolve)
    if record is not None or needs_model(recipe.steps):
        raise UsageError(HOW_TO_SET_A_MODEL)
    return ChosenModel(model=None, label="none (no step needs a model)", resolve=resolve)


def _resolved(source: ModelSource, resolve: Callable[[str], Model]) -> Model:
    """The model `source` names, each model string of it resolved (a fallback's one by one).

    Raises:
        UsageError: a model string is not usable, named with where it came from.
    """
    if source.fallback is None:
        assert source.spec is not None
        return _resolve_one(source.spec, source.origin, resolve)
    named = source.fallback.models
    return FallbackModel(
        *(
            _resolve_one(m, f"{source.origin}, model {i + 1} of {len(named)}", resolve)
            if isinstance(m, str)
            else m
            for i, m in enumerate(named)
        )
    )


def _resolve_one(spec: str, where: str, resolve: Callable[[str], Model]) -> Model:
    try:
        return resolve(spec)
    except MinionsError as exc:
        raise UsageError(f"cannot use model {spec!r} ({where}): {exc}") from None


def model_text(model: Model | str | None) -> str | None:
    """How a recipe names a model (its string; a fallback's strings or names, in order), for
    people; `None` for none."""
    if model is None:
        return None
    if isinstance(model, str):
        return redact_url(model)
    if isinstance(model, FallbackModel):
        return ", then ".join(redact_url(m) if isinstance(m, str) else m.name for m in model.models)
    return model.name


def _replay(path: Path) -> ChosenModel:
    try:
        replay = ReplayModel(Recording.load(path), name="replay")
    except MinionsError as exc:
        raise UsageError(str(exc)) from None
    return ChosenModel(model=replay, label=f"replay of {path}", replay=replay)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def needs_model(steps: Iterable[Step]) -> bool:
    """Whether a step may call the run's model: one that names no model of its own and may
    call one (`Step.uses_model`)."""
    return any(step.model is None and step.uses_model() for step in steps)
