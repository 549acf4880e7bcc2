"""Which step runs next? A chain of responsibility of selection links.

After a step with outgoing transitions completes, its candidates (the transitions' targets)
go through the `StepSelectionChain`. Each `StepSelectionLink` returns a `SelectionDecision`
or ``None`` to pass to the next link. A decision either *chooses* targets (the walk ends) or
*narrows* the candidates for the links after it. The default chain:

1. `SingleCandidateLink`: one candidate without a condition is taken;
2. `ConditionLink`: candidates whose condition holds are taken; when none holds, the
   candidates without a condition remain (the "else" branches);
3. `StepSuggestionLink`: the step's own suggestion (a `next_step` in its completion output);
4. `ModelChoiceLink`: a model picks one with the `select_next_step` tool, constrained to the
   candidates' ids and descriptions;
5. `FirstCandidateLink`: the first candidate.

No candidate left, or no decision: the branch ends there.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from minions._chain import LinkChain, NamedLink, answer_of
from minions._messages import SELECT_TOOL, Message, Prompt, ToolSpec
from minions._routing.conditions import as_template, condition_state, evaluate_condition
from minions._step.model_call import ModelCallExecutor
from minions._step.step import output_text
from minions._templates import missing_fields, template_expressions
from minions.errors import MinionsError, TemplateError

if TYPE_CHECKING:
    from minions._routing.transition import Transition
    from minions._step.context import AgentContext
    from minions._step.execution import StepExecution
    from minions._step.step import Step

__all__ = [
    "ConditionLink",
    "FirstCandidateLink",
    "ModelChoiceLink",
    "Routing",
    "SelectionDecision",
    "SelectionRequest",
    "SingleCandidateLink",
    "StepSelectionChain",
    "StepSelectionLink",
    "StepSuggestionLink",
]


@dataclass(frozen=True, kw_only=True)
class SelectionRequest:
    """What a selection link decides about: a finished step and its candidate transitions."""

    step: Step
    execution: StepExecution
    candidates: tuple[Transition, ...]
    """The transitions still in the running, in declaration order."""
    state: Mapping[str, Any]
    """The run state templates see (``inputs``, step results by id)."""
    context: AgentContext
    steps: Mapping[str, Step]
    """The recipe's steps by id (for their descriptions)."""

    @property
    def targets(self) -> tuple[str, ...]:
        """The ids of the candidate steps, in declaration order."""
        return tuple(t.target for t in self.candidates)


@dataclass(frozen=True, kw_only=True)
class SelectionDecision:
    """What a selection link decided.

    * ``choose``: run these `targets` next (none: the branch ends); the walk stops;
    * ``narrow``: only these `targets` stay candidates for the links that follow.
    """

    kind: Literal["choose", "narrow"]
    targets: tuple[str, ...] = ()
    reason: str = ""

    @classmethod
    def choose(cls, *targets: str, reason: str = "") -> SelectionDecision:
        """Take the transitions to `targets` (and skip the others), saying why."""
        return cls(kind="choose", targets=targets, reason=reason)

    @classmethod
    def end(cls, reason: str = "") -> SelectionDecision:
        """Choose nothing: the branch ends after this step."""
        return cls(kind="choose", reason=reason)

    @classmethod
    def narrow(cls, *targets: str, reason: str = "") -> SelectionDecision:
        """Keep only the candidates to `targets` and let the next link choose among them."""
        return cls(kind="narrow", targets=targets, reason=reason)


@dataclass(frozen=True, kw_only=True)
class Routing:
    """The outcome of a selection: the targets chosen, those not, and which link decided."""

    chosen: tuple[str, ...]
    unchosen: tuple[str, ...]
    selector: str
    reason: str

    def to_data(self) -> dict[str, Any]:
        """As JSON data (a durable run stores the routing of each finished step)."""
        return {
            "chosen": list(self.chosen),
            "unchosen": list(self.unchosen),
            "selector": self.selector,
            "reason": self.reason,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Routing:
        """A routing stored by `to_data`."""
        return cls(
            chosen=tuple(data["chosen"]),
            unchosen=tuple(data["unchosen"]),
            selector=data["selector"],
            reason=data["reason"],
        )


class StepSelectionLink(NamedLink, ABC):
    """One link of a selection chain.

    Subclass it and implement `select`, sync or async. Return ``None`` to let the next link
    decide. `name` identifies the link in the chain and in `RoutingDecided` events.
    """

    @abstractmethod
    def select(
        self, request: SelectionRequest
    ) -> SelectionDecision | Awaitable[SelectionDecision | None] | None:
        """Decide about `request.candidates`, or return ``None`` to pass."""


class StepSelectionChain(LinkChain[StepSelectionLink]):
    """An ordered, immutable chain of selection links (edit it like `StepCompletionChain`)::

    chain = StepSelectionChain.default().remove("model_choice")
    """

    __slots__ = ()
    kind = "selection link"

    @classmethod
    def default(cls) -> StepSelectionChain:
        """Single candidate, conditions, the step's suggestion, a model's choice, the first."""
        return _DEFAULT

    async def select(self, request: SelectionRequest) -> Routing:
        """Walk the links until one chooses; narrowing decisions shrink the candidates.

        Raises:
            MinionsError: a link chose a target that is not a candidate.
        """
        all_targets = request.targets
        names: list[str] = []
        reasons: list[str] = []
        for link in self.links:
            if not request.candidates:
                break
            decision = await answer_of(link.select(request), SelectionDecision)
            if decision is None:
                continue
            unknown = [t for t in decision.targets if t not in request.targets]
            if unknown:
                raise MinionsError(
                    f"selection link {link.name!r} chose {', '.join(map(repr, unknown))} after "
                    f"step {request.step.id!r}, but the candidates are "
                    f"{', '.join(map(repr, request.targets))}"
                )
            names.append(link.name)
            if decision.reason:
                reasons.append(decision.reason)
            if decision.kind == "choose":
                return _routing(all_targets, decision.targets, names, reasons)
            kept = set(decision.targets)
            request = dataclasses.replace(
                request, candidates=tuple(t for t in request.candidates if t.target in kept)
            )
            if not request.candidates:
                reasons.append("no candidate is left")
        if not names:
            names.append("none")
            reasons.append("no selection link decided")
        return _routing(all_targets, (), names, reasons)


def _routing(
    candidates: tuple[str, ...], chosen: tuple[str, ...], names: list[str], reasons: list[str]
) -> Routing:
    picked = set(chosen)
    return Routing(
        chosen=tuple(dict.fromkeys(chosen)),
        unchosen=tuple(t for t in dict.fromkeys(candidates) if t not in picked),
        selector=" > ".join(names),
        reason="; ".join(reasons),
    )


# -- the default links -------------------------------------------------------------------------


class SingleCandidateLink(StepSelectionLink):
    """One candidate without a condition: take it."""

    name = "single_candidate"

    def select(self, request: SelectionRequest) -> SelectionDecision | None:
        if len(request.candidates) == 1 and request.candidates[0].when is None:
            return SelectionDecision.choose(request.candidates[0].target, reason="one candidate")
        return None


class ConditionLink(StepSelectionLink):
    """Candidates with a condition: take every one whose condition holds. When none holds,
    only the candidates without a condition remain (and one such is taken at once)."""

    name = "condition"

    async def select(self, request: SelectionRequest) -> SelectionDecision | None:
        conditional = [t for t in request.candidates if t.when is not None]
        if not conditional:
            return None
        state = condition_state(request.execution, request.state)
        held = []
        absent: dict[str, None] = {}  # values a condition read that do not exist: said
        for transition in conditional:
            try:
                if await evaluate_condition(transition, request.execution, state):
                    held.append(transition)
                    continue
            except TemplateError as exc:
                if not exc.missing:
                    raise MinionsError(
                        f"the condition of {transition.source} -> {transition.target} failed: {exc}"
                    ) from None
            if isinstance(transition.when, str):
                for expression in template_expressions(as_template(transition.when)):
                    absent.update(dict.fromkeys(missing_fields(expression, state)))
        if held:
            return SelectionDecision.choose(
                *(t.target for t in held),
                reason="condition held: " + "; ".join(t.condition_text for t in held),
            )
        none_held = "no condition held"
        if absent:
            none_held += f"; no value for {', '.join(absent)}"
        others = [t.target for t in request.candidates if t.when is None]
        if len(others) == 1:
            return SelectionDecision.choose(
                others[0], reason=f"{none_held}; the one unconditional transition"
            )
        if not others:
            return SelectionDecision.end(reason=none_held)
        return SelectionDecision.narrow(
            *others, reason=f"{none_held}; choosing among the unconditional transitions"
        )


class StepSuggestionLink(StepSelectionLink):
    """The step suggested its next step (`StepExecution.next_step`) and it is a candidate."""

    name = "step_suggestion"

    def select(self, request: SelectionRequest) -> SelectionDecision | None:
        suggested = request.execution.next_step
        if suggested is not None and suggested in request.targets:
            return SelectionDecision.choose(suggested, reason=f"the step suggested {suggested!r}")
        return None


class ModelChoiceLink(StepSelectionLink):
    """A model chooses among the candidates through the `select_next_step` tool.

    The model is the step's own, else the run's. The call is counted in the step's execution
    (model calls and usage) and in the run's usage, and it is subject to the run's token
    budget. When the call fails or the answer names no candidate, the link passes.

    Args:
        instructions: the system prompt of the choice.
    """

    name = "model_choice"

    def __init__(
        self,
        instructions: str = "You route a workflow. Choose the step that should run next by "
        f"calling {SELECT_TOOL}.",
    ) -> None:
        self.instructions = instructions

    def prompt(self, request: SelectionRequest) -> Prompt:
        """The prompt asking for the choice."""
        step, execution = request.step, request.execution
        options = "\n".join(f"- {t.target}: {_describe(request, t)}" for t in request.candidates)
        about = f" ({step.description})" if step.description else ""
        text = (
            f"Step {step.id!r}{about} finished with this result:\n\n"
            f"{output_text(execution.output)}\n\nWhich step runs next? The candidates:\n{options}"
        )
        tool = ToolSpec(
            name=SELECT_TOOL,
            description="Choose the step that runs next.",
            parameters={
                "type": "object",
                "properties": {
                    "step": {"type": "string", "enum": list(request.targets)},
                    "reason": {"type": "string", "description": "Why, in one sentence."},
                },
                "required": ["step"],
            },
        )
        return Prompt(
            messages=(Message.system(self.instructions), Message.user(text)),
            tools=(tool,),
            tool_choice="required",
            step_id=step.id,
            scope=f"{step.id}#{execution.visit}/route",
        )

    async def select(self, request: SelectionRequest) -> SelectionDecision | None:
        context, execution = request.context, request.execution
        try:
            model = context.resolve_model(request.step.model)
            calls = ModelCallExecutor(
                model,
                context=context,
                execution=execution,
                config=execution.config or context.config.merged(request.step.config),
            )
            response = await calls.call(self.prompt(request), turn=execution.turns + 1)
        except MinionsError:
            return None
        chosen: str | None = None
        reason = ""
        for call in response.tool_calls:
            if call.name == SELECT_TOOL:
                chosen = str(call.arguments.get("step", ""))
                reason = str(call.arguments.get("reason", ""))
                break
        else:
            chosen = response.text.strip().strip("'\"`.")
        if chosen not in request.targets:
            return None
        return SelectionDecision.choose(
            chosen, reason=f"the model chose {chosen!r}" + (f": {reason}" if reason else "")
        )


def _describe(request: SelectionRequest, transition: Transition) -> str:
    target = request.steps.get(transition.target)
    described = transition.description or (target.description if target is not None else "")
    return described or "(no description)"


class FirstCandidateLink(StepSelectionLink):
    """The first candidate, in declaration order."""

    name = "first_candidate"

    def select(self, request: SelectionRequest) -> SelectionDecision | None:
        return SelectionDecision.choose(request.candidates[0].target, reason="the first candidate")


_DEFAULT = StepSelectionChain(
    (
        SingleCandidateLink(),
        ConditionLink(),
        StepSuggestionLink(),
        ModelChoiceLink(),
        FirstCandidateLink(),
    )
)
