"""Routing: transitions with conditions, the step's suggestion, a model's choice, the first
candidate; skipping what only unchosen branches lead to; loops bounded by max_visits."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_helpers import Recorder, model_of, run, statuses, step, step_finished

from minions import (
    AgentExecutor,
    AgentRecipe,
    DefaultStep,
    FirstCandidateLink,
    OutputInstructions,
    SelectionDecision,
    SelectionRequest,
    StepSelectionChain,
    StepSelectionLink,
    StepStatus,
    Transition,
)
from minions.events import RoutingDecided, StepSkipped
from minions.testing import ScriptedModel

VERDICT = OutputInstructions(
    {
        "type": "object",
        "properties": {"approved": {"type": "boolean"}, "notes": {"type": "string"}},
        "required": ["approved"],
    }
)


def router_steps(*classify_replies: Any) -> list[DefaultStep]:
    return [
        step("classify", *classify_replies),
        step("billing", description="Questions about invoices and payments."),
        step("tech", description="Technical problems."),
        step("general", description="Anything else."),
    ]


async def test_router_with_conditions() -> None:
    recorder = Recorder()
    result = await run(
        router_steps('{"topic": "billing"}'),
        transitions=[
            Transition("classify", "billing", when="output.topic == 'billing'"),
            Transition("classify", "tech", when=lambda output: '"tech"' in output),
            Transition("classify", "general"),
        ],
        recorder=recorder,
    )
    assert result.ok
    assert statuses(result) == {
        "classify": "completed",
        "billing": "completed",
        "tech": "skipped",
        "general": "skipped",
    }
    [routing] = recorder.of(RoutingDecided)
    assert routing.step_id == "classify"
    assert routing.chosen == ("billing",)
    assert routing.skipped == ("tech", "general")
    assert routing.selector == "condition"
    assert "output.topic == 'billing'" in routing.reason
    reason = result.step("tech").error or ""
    assert reason.startswith("not chosen: 'classify' chose 'billing'")
    assert result.output == "billing done"


async def test_no_condition_holding_takes_the_unconditional_transition() -> None:
    result = await run(
        router_steps("something odd"),
        transitions=[
            Transition("classify", "billing", when="contains(output, 'invoice')"),
            Transition("classify", "general"),
        ],
    )
    assert statuses(result)["general"] == "completed"
    assert statuses(result)["billing"] == "skipped"


async def test_no_condition_and_no_default_ends_the_branch() -> None:
    recorder = Recorder()
    result = await run(
        [step("check", "maybe"), step("yes"), step("after_yes", depends_on=["yes"])],
        transitions=[Transition("check", "yes", when="output == 'yes'")],
        recorder=recorder,
    )
    assert result.ok
    assert statuses(result) == {"check": "completed", "yes": "skipped", "after_yes": "skipped"}
    assert "no condition held" in (result.step("yes").error or "")
    assert "only unchosen or unreached steps lead to it ('yes')" in (
        result.step("after_yes").error or ""
    )
    assert [e.step_id for e in recorder.of(StepSkipped)] == ["yes", "after_yes"]


async def test_router_with_a_model_decision() -> None:
    classify = step(
        "classify",
        "The user cannot log in after the update.",
        [("select_next_step", {"step": "tech", "reason": "a login problem"})],
    )
    steps = [classify, *router_steps()[1:]]
    recorder = Recorder()
    result = await run(
        steps,
        transitions=[Transition("classify", t) for t in ("billing", "tech", "general")],
        recorder=recorder,
    )
    assert statuses(result) == {
        "classify": "completed",
        "billing": "skipped",
        "tech": "completed",
        "general": "skipped",
    }
    [routing] = recorder.of(RoutingDecided)
    assert routing.selector == "model_choice"
    assert routing.reason == "the model chose 'tech': a login problem"
    prompt = model_of(classify).requests[1]
    assert prompt.tool_choice == "required"
    [spec] = prompt.tools
    assert spec.name == "select_next_step"
    assert spec.parameters["properties"]["step"]["enum"] == ["billing", "tech", "general"]
    text = str(prompt)
    assert "The user cannot log in after the update." in text
    assert "- tech: Technical problems." in text
    # The choice is part of the step's cost and of the run's.
    execution = result.step("classify")
    assert len(execution.model_calls) == 2
    assert execution.usage.calls == 2
    assert result.usage.calls == 3


async def test_the_default_policy_takes_the_first_candidate() -> None:
    # The model answers with something that is not a candidate: the first one is taken.
    classify = step("classify", "Hmm.", "banana")
    recorder = Recorder()
    result = await run(
        [classify, *router_steps()[1:]],
        transitions=[Transition("classify", t) for t in ("general", "tech")],
        recorder=recorder,
    )
    assert statuses(result)["general"] == "completed"
    assert statuses(result)["tech"] == "skipped"
    [routing] = recorder.of(RoutingDecided)
    assert routing.selector == "first_candidate"
    assert routing.reason == "the first candidate"


async def test_without_the_model_link_no_model_is_asked() -> None:
    classify = step("classify", "Hmm.")
    chain = StepSelectionChain.default().remove("model_choice")
    result = await run(
        [classify, *router_steps()[1:]],
        transitions=[Transition("classify", t) for t in ("tech", "general")],
        selection_chain=chain,
    )
    assert statuses(result)["tech"] == "completed"
    assert len(model_of(classify).requests) == 1


async def test_the_step_suggests_its_next_step() -> None:
    classify = DefaultStep(
        "classify",
        "Classify.",
        completion_tool=True,
        model=ScriptedModel(
            [[("complete_step", {"result": "it is billing", "next_step": "billing"})]]
        ),
    )
    recorder = Recorder()
    result = await run(
        [classify, *router_steps()[1:]],
        transitions=[Transition("classify", t) for t in ("tech", "billing")],
        recorder=recorder,
    )
    assert statuses(result)["billing"] == "completed"
    assert recorder.of(RoutingDecided)[0].selector == "step_suggestion"


async def test_if_else_merge_joins_the_chosen_branch() -> None:
    merge = step("merge", goal="Merge: {{ yes.output || no.output }}", depends_on=["yes", "no"])
    result = await run(
        [
            step("check", '{"ok": true}'),
            step("yes", "went yes"),
            step("no", "went no"),
            step("after_no", depends_on=["no"]),
            merge,
        ],
        transitions=[
            Transition("check", "yes", when="output.ok"),
            Transition("check", "no", when="!(output.ok)"),
        ],
    )
    assert result.ok
    assert statuses(result) == {
        "check": "completed",
        "yes": "completed",
        "no": "skipped",
        "after_no": "skipped",
        "merge": "completed",
    }
    prompt = str(model_of(merge).requests[0])
    assert "Merge: went yes" in prompt
    assert "[yes]\nwent yes" in prompt
    assert "[no]" not in prompt
    assert result.state["no"]["status"] == "skipped"


async def test_review_loop_ends_by_condition() -> None:
    draft = DefaultStep(
        "draft",
        "Write the text. Feedback so far: {{ review.output.notes || 'none' }}",
        model=ScriptedModel(["text v1", "text v2", "text v3"]),
    )
    review = DefaultStep(
        "review",
        "Review: {{ draft.output }}",
        depends_on=["draft"],
        output=VERDICT,
        model=ScriptedModel(
            [
                '{"approved": false, "notes": "too long"}',
                '{"approved": false, "notes": "too dull"}',
                '{"approved": true}',
            ]
        ),
    )
    recorder = Recorder()
    result = await run(
        [draft, review, step("publish", goal="Publish {{ draft.output }}")],
        transitions=[
            Transition("review", "draft", when="!(output.approved)"),
            Transition("review", "publish", when="output.approved"),
        ],
        recorder=recorder,
    )
    assert result.ok
    assert [(e.step_id, e.visit) for e in result.executions] == [
        ("draft", 1),
        ("review", 1),
        ("draft", 2),
        ("review", 2),
        ("draft", 3),
        ("review", 3),
        ("publish", 1),
    ]
    prompts = [str(p) for p in model_of(draft).requests]
    assert "Feedback so far: none" in prompts[0]
    assert "Feedback so far: too long" in prompts[1]
    assert "Feedback so far: too dull" in prompts[2]
    assert "Review: text v3" in str(model_of(review).requests[2])
    assert result.output == "publish done"
    assert [r.chosen for r in recorder.of(RoutingDecided)] == [("draft",), ("draft",), ("publish",)]
    assert result.visits("draft")[1].status is StepStatus.COMPLETED
    assert result.step("draft").visit == 3
    assert not recorder.of(StepSkipped)


async def test_review_loop_hits_max_visits_and_fails_the_run() -> None:
    draft = DefaultStep("draft", "Write.", max_visits=3, model=ScriptedModel(["v1", "v2", "v3"]))
    review = DefaultStep(
        "review",
        "Review {{ draft.output }}.",
        depends_on=["draft"],
        output=VERDICT,
        model=ScriptedModel(['{"approved": false}'] * 3),
    )
    result = await run(
        [draft, review, step("publish")],
        transitions=[
            Transition("review", "draft", when="!(output.approved)"),
            Transition("review", "publish", when="output.approved"),
        ],
    )
    assert result.status is StepStatus.FAILED
    assert result.error is not None
    assert "step 'draft' reached its max_visits (3)" in result.error
    assert "the loop review -> draft did not end" in result.error
    assert len(result.visits("draft")) == 4  # three runs, then skipped
    assert result.step("draft").status is StepStatus.SKIPPED
    review_visits = result.visits("review")
    assert [v.status for v in review_visits] == [StepStatus.COMPLETED] * 3 + [StepStatus.SKIPPED]
    assert statuses(result)["publish"] == "skipped"


async def test_max_visits_defaults_to_ten() -> None:
    draft = DefaultStep("draft", "Write.", model=ScriptedModel([f"v{i}" for i in range(10)]))
    review = DefaultStep(
        "review", "Review {{ draft.output }}.", depends_on=["draft"], output=VERDICT,
        model=ScriptedModel(['{"approved": false}'] * 10),
    )  # fmt: skip
    result = await run(
        [draft, review],
        transitions=[Transition("review", "draft", when="!(output.approved)")],
    )
    assert result.status is StepStatus.FAILED
    assert "step 'draft' reached its max_visits (10)" in (result.error or "")
    assert [v.status for v in result.visits("draft")][:10] == [StepStatus.COMPLETED] * 10


async def test_a_single_unconditional_transition_is_taken_without_asking() -> None:
    recorder = Recorder()
    result = await run(
        [step("a"), step("b"), step("c")],
        transitions=[Transition("a", "b")],
        recorder=recorder,
    )
    assert result.ok
    [routing] = recorder.of(RoutingDecided)
    assert routing.selector == "single_candidate"
    assert routing.chosen == ("b",)


async def test_a_loop_reruns_what_follows_the_loop_target() -> None:
    # gather -> analyse -> check; check loops back to gather; analyse must run again too.
    check = DefaultStep(
        "check",
        "Check {{ analyse.output }}.",
        depends_on=["analyse"],
        model=ScriptedModel(["retry", "fine"]),
    )
    result = await run(
        [
            step("gather", "g1", "g2"),
            step("analyse", "a1", "a2", depends_on=["gather"]),
            check,
            step("report", depends_on=["check"]),
        ],
        transitions=[Transition("check", "gather", when="output == 'retry'")],
    )
    assert result.ok
    assert [e.step_id for e in result.executions] == [
        "gather",
        "analyse",
        "check",
        "gather",
        "analyse",
        "check",
        "report",
    ]
    assert "Check a2." in str(model_of(check).requests[1])


async def test_async_conditions_and_state_in_conditions() -> None:
    async def urgent(output: Any) -> bool:
        return "urgent" in output

    result = await run(
        [step("triage", "urgent: server down"), step("page"), step("ticket")],
        inputs={"on_call": True},
        transitions=[
            Transition("triage", "page", when=urgent),
            Transition("triage", "ticket", when="!(inputs.on_call)"),
        ],
    )
    assert statuses(result) == {"triage": "completed", "page": "completed", "ticket": "skipped"}


class AlwaysTicket(StepSelectionLink):
    def select(self, request: SelectionRequest) -> SelectionDecision | None:
        if "ticket" in request.targets:
            return SelectionDecision.choose("ticket", reason="policy")
        return None


async def test_the_selection_chain_is_customizable() -> None:
    chain = StepSelectionChain.default().add_first(AlwaysTicket())
    assert chain.names == (
        "always_ticket",
        "single_candidate",
        "condition",
        "step_suggestion",
        "model_choice",
        "first_candidate",
    )
    assert StepSelectionChain.default().names[0] == "single_candidate"  # unchanged
    recorder = Recorder()
    recipe = AgentRecipe(
        id="custom",
        steps=[step("triage", "urgent"), step("page"), step("ticket")],
        transitions=[Transition("triage", "page"), Transition("triage", "ticket")],
    )
    result = await AgentExecutor(selection_chain=chain).execute(recipe, listeners=[recorder])
    assert statuses(result)["ticket"] == "completed"
    assert recorder.of(RoutingDecided)[0].selector == "always_ticket"
    only_first = StepSelectionChain([FirstCandidateLink()])
    assert only_first.replace("first_candidate", AlwaysTicket()).names == ("always_ticket",)


class Narrow(StepSelectionLink):
    def select(self, request: SelectionRequest) -> SelectionDecision | None:
        return SelectionDecision.narrow(*request.targets[1:], reason="not the first")


async def test_narrowing_links_leave_fewer_candidates_for_the_next() -> None:
    chain = StepSelectionChain([Narrow(), FirstCandidateLink()])
    recorder = Recorder()
    result = await run(
        [step("a"), step("b"), step("c"), step("d")],
        transitions=[Transition("a", t) for t in ("b", "c", "d")],
        selection_chain=chain,
        recorder=recorder,
    )
    assert statuses(result)["c"] == "completed"
    [routing] = recorder.of(RoutingDecided)
    assert routing.selector == "narrow > first_candidate"
    assert routing.reason == "not the first; the first candidate"


class Broken(StepSelectionLink):
    def select(self, request: SelectionRequest) -> SelectionDecision | None:
        return SelectionDecision.choose("nowhere")


async def test_a_link_choosing_a_non_candidate_fails_the_run_clearly() -> None:
    recorder = Recorder()
    result = await run(
        # "c", on a branch of its own, is still running when the link fails.
        [step("a"), step("b"), step("c", gate=recorder.event_when(step_finished("a")))],
        transitions=[Transition("a", "b")],
        selection_chain=StepSelectionChain([Broken()]),
        recorder=recorder,
    )
    assert result.status is StepStatus.FAILED
    assert result.error is not None
    assert "choosing the step after 'a' failed" in result.error
    assert "chose 'nowhere'" in result.error
    assert statuses(result)["b"] == "skipped"


def test_selection_decisions() -> None:
    chosen = SelectionDecision.choose("x", reason="r")
    assert (chosen.kind, chosen.targets, chosen.reason) == ("choose", ("x",), "r")
    ended = SelectionDecision.end("no way on")
    assert (ended.kind, ended.targets) == ("choose", ())  # choosing nothing ends the branch
    narrowed = SelectionDecision.narrow("x", "y")
    assert (narrowed.kind, narrowed.targets) == ("narrow", ("x", "y"))


class AsyncChooser(StepSelectionLink):
    async def select(self, request: SelectionRequest) -> SelectionDecision | None:
        await asyncio.sleep(0)
        return SelectionDecision.choose(request.targets[-1], reason="the last, asynchronously")


async def test_an_async_selection_link_decides() -> None:
    result = await run(
        [step("a"), step("b"), step("c")],
        transitions=[Transition("a", "b"), Transition("a", "c")],
        selection_chain=StepSelectionChain([AsyncChooser()]),
    )
    assert statuses(result) == {"a": "completed", "b": "skipped", "c": "completed"}
