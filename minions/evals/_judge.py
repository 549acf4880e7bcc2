"""The judge: a model grading an output against a rubric, pass or fail with a reason, through
structured output. Verdicts are cached by (rubric, output, judge model), kept with an eval's
recordings (``judge.json``) and answered from them in a replay."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions._messages import Usage
from minions._text import as_text, jsonable
from minions.errors import MinionsError

if TYPE_CHECKING:
    from minions.models import Model
    from minions.recipes import AgentRecipe

__all__ = ["Judge", "Verdict"]

FORMAT = "minions.judge-verdicts/1"
FILE = "judge.json"
"""The verdicts' file in a recordings folder."""

_RECIPE = """\
id: judge
inputs:
  rubric: {type: string}
  output: {type: string}
steps:
  - id: verdict
    system: >-
      You grade the output of an AI agent against a rubric. Judge only what the rubric asks.
      Answer with whether the output meets the rubric, and one short sentence saying why.
    goal: |-
      Rubric: {{ inputs.rubric }}

      The output to grade:
      <output>
      {{ inputs.output }}
      </output>

      Does the output meet the rubric?
    output: {passed: true, reason: ""}
"""


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """A judge's answer: passed or not, and why; or why there is no answer (`error`)."""

    passed: bool = False
    reason: str = ""
    error: str | None = None


def verdict_key(rubric: str, output: Any, model: str) -> str:
    text = json.dumps([rubric, jsonable(output), model], ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Judge:
    """Grades outputs against rubrics with `model`, once per (rubric, output, model).

    Args:
        model: the judge model; ``None`` in a replay (every verdict comes from `verdicts`).
        label: the judge model's name, in keys and reports.
        verdicts: a recordings folder's verdicts to answer from (replay) or to add to
            (record); see `load` and `save`.
        replay: answer only from `verdicts`: a verdict not there is an error, and no model
            is called.
    """

    def __init__(
        self,
        model: Model | None,
        *,
        label: str,
        verdicts: dict[str, dict[str, Any]] | None = None,
        replay: bool = False,
    ) -> None:
        self.model = model
        self.label = label
        self.verdicts: dict[str, dict[str, Any]] = dict(verdicts or {})
        self.replay = replay
        self.usage = Usage()
        """Tokens the judge's model calls used."""
        self.calls = 0
        self._pending: dict[str, asyncio.Future[Verdict]] = {}
        self._recipe: AgentRecipe | None = None

    @staticmethod
    def load(folder: Path) -> tuple[str | None, dict[str, dict[str, Any]]]:
        """The judge model and verdicts kept in a recordings folder (none: ``(None, {})``).

        Raises:
            MinionsError: the file is not a verdicts file.
        """
        file = folder / FILE
        if not file.is_file():
            return None, {}
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise MinionsError(f"cannot read the judge's verdicts {str(file)!r}: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MinionsError(f"{str(file)!r} is not a file of judge verdicts ({FORMAT})")
        verdicts = data.get("verdicts", {})
        model = data.get("model")
        return (model if isinstance(model, str) else None), dict(verdicts)

    def save(self, folder: Path) -> None:
        """Write the verdicts into a recordings folder (when there are any)."""
        if not self.verdicts:
            return
        data = {
            "format": FORMAT,
            "model": self.label,
            "verdicts": dict(sorted(self.verdicts.items())),
        }
        (folder / FILE).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", "utf-8")

    async def grade(self, rubric: str, output: Any) -> Verdict:
        """The verdict on `output` against `rubric`: from the cache, else the model (one call
        per key, however many runs ask at once)."""
        key = verdict_key(rubric, output, self.label)
        kept = self.verdicts.get(key)
        if kept is not None:
            return Verdict(passed=bool(kept.get("passed")), reason=str(kept.get("reason", "")))
        if self.replay or self.model is None:
            return Verdict(
                error=f"the recordings have no verdict of judge {self.label!r} for rubric "
                f"{rubric[:60]!r} on this output; record the eval again"
            )
        task = self._pending.get(key)
        if task is None:
            task = self._pending[key] = asyncio.ensure_future(self._ask_once(key, rubric, output))
        return await asyncio.shield(task)

    async def _ask_once(self, key: str, rubric: str, output: Any) -> Verdict:
        try:
            verdict = await self._ask(rubric, output)
        finally:
            self._pending.pop(key, None)
        if verdict.error is None:
            self.verdicts[key] = {
                "rubric": rubric,
                "passed": verdict.passed,
                "reason": verdict.reason,
            }
        return verdict

    async def _ask(self, rubric: str, output: Any) -> Verdict:
        from minions._agent.executor import AgentExecutor

        if self._recipe is None:
            from minions.recipes import parse_recipe

            self._recipe = parse_recipe(_RECIPE)
        assert self.model is not None
        model = self.model
        executor = AgentExecutor(model_resolver=lambda _spec: model)
        result = await executor.execute(
            self._recipe, {"rubric": rubric, "output": as_text(jsonable(output), indent=1)}
        )
        self.calls += sum(len(e.model_calls) for e in result.executions)
        self.usage = self.usage + result.usage
        if not result.ok:
            return Verdict(error=f"judge {self.label!r} did not answer: {result.error}")
        answer = result.output if isinstance(result.output, dict) else {}
        passed, reason = answer.get("passed"), answer.get("reason")
        if not isinstance(passed, bool):
            return Verdict(
                error=f"judge {self.label!r} gave no verdict: {as_text(result.output)[:200]}"
            )
        return Verdict(
            passed=passed, reason=str(reason or ("meets the rubric" if passed else "does not"))
        )
