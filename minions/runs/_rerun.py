"""Reruns: which steps of a finished run a new run reuses, and which it executes again.

A rerun from step S reuses the recorded result of every step that does not depend on S,
directly or through others (its dependencies and the targets of its transitions, loops
included). It executes again S, every step whose definition changed (a new recipe version),
every step whose rendered templates (goal, params, items...) change with the new inputs,
what follows an output set by hand, and everything downstream of those. `reexecuted` is that
rule as a pure function of the graph; `plan_rerun` applies it to a stored run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from minions._item import ItemId
from minions._templates import render, template_expressions, template_roots
from minions.errors import MinionsError, RerunError, TemplateError
from minions.runs import _checkpoints as checkpoints
from minions.runs import _runs as runs
from minions.runs._runs import RerunPlan, RunRecord

if TYPE_CHECKING:
    import sqlalchemy as sa

    from minions._agent.graph import StepGraph
    from minions.recipes import AgentRecipe, RecipeSpec
    from minions.runs._checkpoints import Checkpoint

__all__: list[str] = []


def reexecuted(
    followers: Mapping[str, Sequence[str]],
    *,
    from_step: str,
    changed: Collection[str] = (),
    edited: Collection[str] = (),
) -> frozenset[str]:
    """The steps a rerun executes again: `from_step`, the `changed` steps and everything
    downstream of them (`followers`: each step's dependents and transition targets), and
    everything downstream of an `edited` step (one whose output is set by hand; the edited
    step itself is reused, unless something upstream of it runs again)."""
    found: set[str] = set()
    pending = [from_step, *changed, *(f for e in edited for f in followers.get(e, ()))]
    while pending:
        step = pending.pop()
        if step in found:
            continue
        found.add(step)
        pending.extend(followers.get(step, ()))
    return frozenset(found)


def plan_rerun(
    parent: RunRecord,
    graph: StepGraph,
    *,
    from_step: str,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    definitions: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None,
) -> RerunPlan:
    """Plan a rerun of `parent` (with its finished steps) on `graph` from `from_step`, with
    the checked `inputs` and the outputs set by hand. `definitions`: the parent's and the new
    recipe version's step definitions (by step id), when the recipe changed.

    Raises:
        RerunError: an unknown step, an output set on a step that runs again or that the
            parent did not complete, or an output its step's schema refuses.
    """
    steps, followers = graph.steps, graph.followers
    for name in (from_step, *outputs):
        if name not in steps:
            raise RerunError(
                f"run {parent.run_id} has no step {name!r}; its steps: {', '.join(steps)}"
            )
    changed: dict[str, str] = {}
    if definitions is not None:
        before, after = definitions
        for step_id in steps:
            if before.get(step_id) != after.get(step_id):
                changed[step_id] = "definition"
    old_state, new_state = _states(parent, graph.recipe, inputs)
    for step_id, step in steps.items():
        if step_id in changed:
            continue
        if _renders_differently(step.templates(), old_state, new_state):
            changed[step_id] = "inputs"
            continue
        # Its routing: a condition of its transitions that reads the inputs may now choose
        # otherwise (conditions see the step's own result too).
        own = old_state.get(step_id)
        conditions = {
            str(i): t.when if "{{" in t.when else "{{ " + t.when + " }}"
            for i, t in enumerate(graph.outgoing[step_id])
            if isinstance(t.when, str)
        }
        if conditions and _renders_differently(
            conditions,
            {**old_state, **(own if isinstance(own, dict) else {})},
            {**new_state, **(own if isinstance(own, dict) else {})},
        ):
            changed[step_id] = "inputs"
    again = reexecuted(followers, from_step=from_step, changed=changed, edited=outputs)
    completed = parent.completed_steps
    checked: dict[str, Any] = {}
    for step_id, value in outputs.items():
        if step_id in again:
            raise RerunError(
                f"step {step_id!r} runs again in this rerun (it is {from_step!r} or after it, "
                "or its inputs changed): its output cannot be set"
            )
        if step_id not in completed:
            raise RerunError(
                f"step {step_id!r} did not complete in run {parent.run_id}: there is no output "
                "of it to replace"
            )
        instructions = steps[step_id].output
        if instructions is not None:
            try:
                value = instructions.validate_python(value)
            except MinionsError as exc:
                raise RerunError(
                    f"the output set for step {step_id!r} does not match its schema: {exc}"
                ) from None
        checked[step_id] = _jsonable(value)
    reused = tuple(s for s in steps if s not in again)
    return RerunPlan(
        parent_run_id=parent.run_id,
        from_step=from_step,
        reused=reused,
        rerun=tuple(s for s in steps if s in again),
        changed={s: why for s, why in changed.items() if s in again},
        outputs=checked,
        editable=tuple(s for s in reused if s in completed),
    )


def seeding(plan: RerunPlan, *, attempt: int) -> Callable[[sa.Connection], list[Checkpoint]]:
    """What a rerun's insert reads its seeds with, in its own transaction: it holds the
    parent (ended at `attempt`, the attempt the plan was made from) until the commit, then
    reads its checkpoints. A prune that deleted the parent since the plan was made refuses
    the rerun (nothing is queued); one that comes later waits for the commit, and the rerun
    has its seeds by then: a rerun is never queued without them.

    Raises (from the callable):
        UnknownRunError: the parent was pruned meanwhile.
        RunStateError: it was resumed meanwhile.
    """

    def read(db: sa.Connection) -> list[Checkpoint]:
        runs.hold_ended(db, plan.parent_run_id, attempt=attempt)
        return seeds(plan, checkpoints.saved_in(db, plan.parent_run_id))

    return read


def request_hash(plan: RerunPlan, snapshot_hash: str) -> str:
    """What an idempotency key of a rerun names: its parent, its step, the outputs set by
    hand, and the submit it amounts to (`snapshot_hash`: the recipe version and inputs)."""
    import hashlib

    request = json.dumps(
        {
            "rerun_of": plan.parent_run_id,
            "from_step": plan.from_step,
            "outputs": _jsonable(dict(plan.outputs)),
            "cache": plan.cache,
            "submit": snapshot_hash,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(request.encode()).hexdigest()


def seeds(plan: RerunPlan, saved: Mapping[tuple[str, int], Checkpoint]) -> list[Checkpoint]:
    """The checkpoints a rerun starts with: the parent's completed executions (`saved`: its
    checkpoints, in the order the parent saved them) of the steps the rerun reuses, as
    reused (`Checkpoint.reused`), with the outputs set by hand in place. A loop item is
    copied only when its step did not finish in the parent (its items are then reused as
    recorded)."""
    import time

    now = time.time()
    reused = set(plan.reused)
    copied: list[Checkpoint] = []
    for (name, visit), checkpoint in saved.items():
        item = ItemId.parse(name)
        if item.step not in reused or (item.item is not None and (item.step, visit) in saved):
            continue
        if not checkpoint.completed:
            continue
        edited = (
            {}
            if item.item is not None or item.step not in plan.outputs
            else {"output": plan.outputs[item.step]}
        )
        copied.append(
            checkpoint.reused(
                plan.parent_run_id,
                now=now,
                # In the order the parent saved them (`runs show` lists steps in that order).
                saved_at=now + len(copied) * 1e-6,
                **edited,
            )
        )
    return copied


def step_definitions(recipe: str | RecipeSpec) -> dict[str, Any]:
    """Each step's definition in `recipe` (its YAML, or parsed already), by step id, as data
    to compare. A change of what every step shares (the recipe's model, system prompt,
    config, transitions...) changes every step's definition."""
    from minions.recipes import parse_spec

    spec = parse_spec(recipe)[0] if isinstance(recipe, str) else recipe
    shared = spec.model_dump(exclude={"steps", "description", "inputs"})
    return {
        step.id: {"step": step.model_dump(exclude={"description"}), "shared": shared}
        for step in spec.steps
    }


def _jsonable(value: Any) -> Any:
    from minions._text import jsonable

    return jsonable(value)


def _states(
    parent: RunRecord, recipe: AgentRecipe, inputs: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The template state the parent's steps saw (its inputs and its steps' results, the
    last visit of each), and the same state with the new inputs."""
    results: dict[str, Any] = {}
    for s in parent.steps:
        results[s.step_id] = {
            "output": s.output,
            "status": "completed" if s.status == "reused" else s.status,
            "error": s.error,
            "visit": s.visit,
        }
    for alias, step_id in recipe.aliases.items():
        if step_id in results:
            results[alias] = results[step_id]["output"]
    return {**results, "inputs": dict(parent.inputs)}, {**results, "inputs": dict(inputs)}


def _renders_differently(
    templates: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]
) -> bool:
    """Whether an expression of the step's templates that reads the inputs renders to
    something else with the new inputs. Expressions are rendered one at a time, so that one
    which reads only a loop's item (unknown before the step runs) does not count."""
    if old["inputs"] == new["inputs"]:
        return False
    for value in templates.values():
        for expression in template_expressions(value):
            whole = "{{ " + expression + " }}"
            try:
                if "inputs" not in template_roots(whole):
                    continue
                before, after = render(whole, old), render(whole, new)
            except TemplateError:
                # It cannot be rendered from the run's state alone (it reads a loop's item
                # too, or a value the model fills in): it reads the inputs, which changed.
                return True
            if json.dumps(_jsonable(before), sort_keys=True) != json.dumps(
                _jsonable(after), sort_keys=True
            ):
                return True
    return False
