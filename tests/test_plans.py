"""Plans from requirements: a planner answers with a `Plan` (structured output), minions checks
it (one re-ask with the problems), each step runs with only its goal, its inputs and its
dependencies' artifacts, a failed step is replanned, and tokens are reported honestly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from minions import (
    AgentExecutor,
    ModelCallResponse,
    Plan,
    PlanError,
    PlanGenerator,
    PlanStep,
    Prompt,
    StepStatus,
    Usage,
)
from minions._messages import Message
from minions.cli._app import Settings, app
from minions.errors import RecipeError
from minions.events import (
    Event,
    PlanRevised,
    StepCompleted,
    StepStarted,
    event_from_json,
    event_to_json,
)
from minions.recipes import load_recipe, parse_recipe
from minions.testing import FakeOpenAIServer, FakeReply, FakeRequest, FunctionModel, ScriptedModel


def step(id: str, type: str = "generate", **fields: Any) -> dict[str, Any]:
    return {"id": id, "type": type, "goal": f"Do {id}.", **fields}


def plan_json(*steps: dict[str, Any], description: str = "User management") -> str:
    return json.dumps({"id": "users", "description": description, "steps": list(steps)})


SIX = plan_json(
    step("analyze", "analyze", inputs=["README.md", "app/models.py"], artifacts=["analysis"]),
    step("user_model", inputs=["app/models.py"], depends_on=["analyze"], artifacts=["app/user.py"]),
    step("auth", inputs=["app/auth.py"], depends_on=["user_model"], artifacts=["app/login.py"]),
    step("api", inputs=["app/api.py"], depends_on=["user_model"], artifacts=["app/routes.py"]),
    step("validate", "validate", depends_on=["auth", "api"], artifacts=["report"]),
    step("cleanup", "cleanup", depends_on=["validate"], artifacts=["summary"]),
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "app").mkdir()
    (tmp_path / "README.md").write_text("A small web app.\n")
    (tmp_path / "app" / "models.py").write_text("class Account:\n    name: str\n")
    (tmp_path / "app" / "auth.py").write_text("SECRET = 'x'\n")
    (tmp_path / "app" / "api.py").write_text("ROUTES = []\n")
    return tmp_path


def worker(prompt: Prompt) -> str:
    """Answers each step with artifacts: a file for a step that names one, text otherwise."""
    step_id = (prompt.step_id or "").split("[")[0]
    files = []
    if step_id in ("user_model", "auth", "api"):
        path = {"user_model": "app/user.py", "auth": "app/login.py", "api": "app/routes.py"}
        files.append({"path": path[step_id], "content": f"# made by {step_id}\n"})
    return json.dumps({"text": f"{step_id} done", "files": files, "data": {"step": step_id}})


def generate(planner: ScriptedModel, project: Path, requirements: str = "Users") -> Plan:
    return asyncio.run(PlanGenerator(planner).generate(requirements, workspace=project))


# -- the contract ------------------------------------------------------------------------------


def test_the_contract_plan_recipe_run_yaml(project: Path) -> None:
    planner = ScriptedModel([SIX])
    plan = asyncio.run(
        PlanGenerator(planner).generate(
            "Create a user management system with authentication",
            tools=["read_file", "write_file"],
            workspace=project,
        )
    )
    assert next(s.type for s in plan.steps) == "analyze"
    recipe = plan.to_recipe(workspace=project)
    result = asyncio.run(AgentExecutor(model=FunctionModel(worker)).execute(recipe))
    assert result.ok, result.error
    assert result.usage.calls == 6
    assert (project / "app" / "user.py").read_text() == "# made by user_model\n"
    assert result.step("validate").result()["data"] == {"step": "validate"}
    # The planner saw the requirements and the workspace's files, and nothing of a format to
    # parse: the plan came back as structured output.
    asked = str(planner.requests[0])
    assert "Create a user management system" in asked
    assert "app/models.py" in asked
    text = plan.to_yaml(workspace=str(project))
    again = parse_recipe(text)
    assert [s.id for s in again.steps] == [s.id for s in plan.steps]
    assert again.step("analyze").reads == ("README.md", "app/models.py")  # type: ignore[attr-defined]
    rerun = asyncio.run(AgentExecutor(model=FunctionModel(worker)).execute(again))
    assert rerun.ok, rerun.error


def test_an_edited_yaml_plan_runs_with_minions_run(project: Path, tmp_path: Path) -> None:
    file = project / "plan.yaml"
    settings = Settings(resolve_model=lambda spec: ScriptedModel([SIX]))
    done = CliRunner().invoke(
        app,
        ["plan", "Users", "--model", "m", "--workspace", str(project), "-o", str(file)],
        obj=settings,
    )
    assert done.exit_code == 0, done.output
    assert "plan users" in done.stdout
    assert "flowchart" in done.stdout  # its graph
    edited = file.read_text().replace("Do cleanup.", "Summarise the work in two lines.")
    file.write_text(edited)
    recipe = load_recipe(file)
    seen: list[str] = []

    def model(prompt: Prompt) -> str:
        seen.append(str(prompt))
        return worker(prompt)

    result = AgentExecutor(model=FunctionModel(model)).execute_sync(recipe)
    assert result.ok, result.error
    assert any("Summarise the work in two lines." in s for s in seen)
    run = CliRunner().invoke(
        app,
        ["run", str(file), "--model", "m", "--quiet", "--no-preflight"],
        obj=Settings(resolve_model=lambda spec: FunctionModel(worker)),
    )
    assert run.exit_code == 0, run.output


# -- checking the plan -------------------------------------------------------------------------


def test_an_invalid_plan_is_sent_back_once_with_its_problems(project: Path) -> None:
    bad = plan_json(step("a", "analyze"), step("b", depends_on=["nope"]))
    planner = ScriptedModel([bad, plan_json(step("a", "analyze"), step("b", depends_on=["a"]))])
    plan = generate(planner, project)
    assert [s.depends_on for s in plan.steps] == [[], ["a"]]
    reask = str(planner.requests[1])
    assert "unknown step 'nope'" in reask
    assert '"nope"' not in reask  # the failed answer left no trace (transactional re-ask)


def test_a_second_invalid_plan_fails_clearly(project: Path) -> None:
    cyclic = plan_json(step("a", depends_on=["b"]), step("b", depends_on=["a"]))
    planner = ScriptedModel([cyclic, cyclic])
    with pytest.raises(PlanError, match="cycle"):
        generate(planner, project)
    assert len(planner.requests) == 2


def test_an_answer_that_is_not_a_plan_fails_after_the_reask(project: Path) -> None:
    planner = ScriptedModel(["Step 1: analyze. Step 2: build.", '{"steps": "many"}'])
    with pytest.raises(PlanError, match="no valid plan"):
        generate(planner, project)


def test_brackets_in_dependencies_are_trimmed_to_the_ids_they_name(project: Path) -> None:
    """The text parser's first bug: ``DEPENDENCIES: [a, b]`` became ids ``[a`` and ``b]``.
    A planner's ids are made slugs (never refused for their characters), the same way in
    ``id`` and ``depends_on``, so they still name each other; what names no step is refused."""
    plan = Plan.model_validate_json(
        plan_json(step("a"), step("b"), step("c", depends_on=["[a", "b]"]))
    )
    assert plan.step("c").depends_on == ["a", "b"]
    assert plan.problems() == []
    assert [s.id for s in plan.to_recipe().steps] == ["a", "b", "c"]
    bracketed = Plan.model_validate_json(plan_json(step("[a]")))
    assert [s.id for s in bracketed.steps] == ["a"]
    dangling = Plan.model_validate_json(plan_json(step("a"), step("c", depends_on=["[z]"])))
    assert [p.message for p in dangling.problems()] == ["unknown step 'z'"]


def test_a_planners_free_text_ids_become_slugs(project: Path) -> None:
    answer = json.dumps(
        {
            "id": "User management / v2",
            "description": "Users.",
            "steps": [
                {"id": "Write the model", "type": "generate", "goal": "Do it."},
                {
                    "id": "2. Test it!",
                    "type": "validate",
                    "goal": "Check it.",
                    "depends_on": ["Write the model"],
                },
                {
                    "id": "x" * 300,
                    "type": "cleanup",
                    "goal": "Tidy.",
                    "depends_on": ["2. Test it!"],
                },
            ],
        }
    )
    plan = generate(ScriptedModel([answer]), project)
    recipe = plan.to_recipe(workspace=project)
    assert recipe.id == "user-management-v2"
    long_id = plan.steps[2].id
    assert [s.id for s in recipe.steps] == ["write_the_model", "step_2_test_it", long_id]
    assert len(long_id) == 64
    assert plan.steps[1].depends_on == ["write_the_model"]
    assert plan.steps[2].depends_on == ["step_2_test_it"]


def test_the_last_step_is_not_added_twice(project: Path) -> None:
    """The second bug: the last step was added twice. A plan has exactly its steps, and a
    plan repeating an id is refused."""
    planner = ScriptedModel([plan_json(step("a", "analyze"), step("b"), step("c"))])
    plan = generate(planner, project)
    recipe = plan.to_recipe(workspace=project)
    assert [s.id for s in recipe.steps] == ["a", "b", "c"]
    result = asyncio.run(AgentExecutor(model=FunctionModel(worker)).execute(recipe))
    assert [e.step_id for e in result.executions].count("c") == 1
    twice = Plan.model_validate_json(plan_json(step("a"), step("c"), step("c")))
    assert any("duplicate step id" in p.message for p in twice.problems())


def test_the_plan_description_is_kept(project: Path) -> None:
    """The third bug: every step's DESCRIPTION overwrote the plan's."""
    answer = plan_json(step("a", "analyze"), step("b"), description="Users with login")
    plan = generate(ScriptedModel([answer]), project)
    assert plan.description == "Users with login"
    assert plan.to_recipe().description == "Users with login"
    assert [s.goal for s in plan.steps] == ["Do a.", "Do b."]


# -- bad input ---------------------------------------------------------------------------------


def test_bad_input_is_refused_before_any_model_call(project: Path) -> None:
    planner = ScriptedModel([SIX])
    with pytest.raises(PlanError, match="requirements are empty"):
        generate(planner, project, requirements="  ")
    with pytest.raises(PlanError, match="does not exist"):
        asyncio.run(PlanGenerator(planner).generate("x", workspace=project / "nowhere"))
    with pytest.raises(PlanError, match="unknown tool 'deploy'"):
        asyncio.run(PlanGenerator(planner).generate("x", tools=["read_file", "deploy"]))
    assert planner.requests == []


def test_a_plan_naming_a_tool_that_does_not_exist_is_refused(project: Path) -> None:
    bad = plan_json(step("a", tools=["deploy"]))
    planner = ScriptedModel([bad, bad])
    with pytest.raises(PlanError, match="deploy"):
        generate(planner, project)
    assert "deploy" in str(planner.requests[1])


def test_the_cli_says_what_is_wrong_with_exit_code_2(project: Path) -> None:
    settings = Settings(resolve_model=lambda spec: ScriptedModel([SIX]))
    cases = [
        (["plan", "", "-m", "m"], "requirements are empty"),
        (["plan", "x", "-m", "m", "--workspace", str(project / "nope")], "does not exist"),
        (["plan", "x", "-m", "m", "--tools", "no_such_module_here"], "no_such_module_here"),
    ]
    for args, message in cases:
        done = CliRunner().invoke(app, args, obj=settings)
        assert done.exit_code == 2, (args, done.output)
        assert message in done.stderr
        assert "Traceback" not in done.output
    bad = plan_json(step("a", depends_on=["zz"]))
    done = CliRunner().invoke(
        app,
        ["plan", "x", "-m", "m", "--workspace", str(project)],
        obj=Settings(resolve_model=lambda spec: ScriptedModel([bad, bad])),
    )
    assert done.exit_code == 2
    assert "unknown step 'zz'" in done.stderr


# -- minimal context and artifacts -------------------------------------------------------------


def test_each_step_sees_its_goal_its_inputs_and_its_dependencies_artifacts_only(
    project: Path,
) -> None:
    plan = generate(ScriptedModel([SIX]), project)
    prompts: dict[str, str] = {}

    def model(prompt: Prompt) -> str:
        prompts[(prompt.step_id or "")] = "\n".join(m.content for m in prompt.messages)
        return worker(prompt)

    result = asyncio.run(
        AgentExecutor(model=FunctionModel(model)).execute(plan.to_recipe(workspace=project))
    )
    assert result.ok
    auth = prompts["auth"]
    assert "Do auth." in auth
    assert "SECRET = 'x'" in auth  # its input
    assert "# made by user_model" in auth  # its dependency's file artifact
    assert "ROUTES = []" not in auth  # another step's input
    assert "analyze done" not in auth  # not a direct dependency
    assert "A small web app." not in auth
    validate = prompts["validate"]
    assert "# made by auth" in validate
    assert "# made by api" in validate
    assert "user_model done" not in validate
    # Inputs are read through the workspace file tools, and files are written through them.
    calls = [c.name for c in result.step("user_model").tool_calls]
    assert calls == ["read_file", "write_file"]
    assert result.step("analyze").result()["text"] == "analyze done"


def test_a_step_whose_input_is_missing_fails_naming_it(project: Path) -> None:
    plan = Plan.model_validate_json(plan_json(step("a", inputs=["ghost.py"])))
    model = ScriptedModel([])
    result = asyncio.run(AgentExecutor(model=model).execute(plan.to_recipe(workspace=project)))
    assert result.step("a").status is StepStatus.FAILED
    assert "ghost.py" in (result.step("a").error or "")
    assert model.requests == []


def test_independent_steps_run_at_the_same_time(project: Path) -> None:
    plan = generate(ScriptedModel([SIX]), project)
    both = asyncio.Barrier(2)

    async def model(prompt: Prompt) -> str:
        if prompt.step_id in ("auth", "api"):
            # Each of the two waits for the other: they finish only if they run together.
            await asyncio.wait_for(both.wait(), timeout=10)
        return worker(prompt)

    result = asyncio.run(
        AgentExecutor(model=FunctionModel(model)).execute(plan.to_recipe(workspace=project))
    )
    assert result.ok, result.error


# -- replanning --------------------------------------------------------------------------------


def test_a_failed_step_is_replanned_and_completed_steps_are_kept(project: Path) -> None:
    first = plan_json(
        step("analyze", "analyze", inputs=["README.md"]),
        step("build", inputs=["app/missing.py"], depends_on=["analyze"]),
    )
    revised = plan_json(step("build_again", inputs=["app/models.py"], depends_on=["analyze"]))
    planner = ScriptedModel([first, revised])
    generator = PlanGenerator(planner)
    plan = asyncio.run(generator.generate("Users"))  # no workspace: inputs are not checked
    ran: list[str] = []

    def model(prompt: Prompt) -> str:
        ran.append(prompt.step_id or "")
        return worker(prompt)

    events: list[Event] = []
    result = asyncio.run(
        generator.execute(
            plan,
            executor=AgentExecutor(model=FunctionModel(model)),
            requirements="Users",
            workspace=project,
            listeners=[events.append],
        )
    )
    assert result.ok, result.error
    assert ran == ["analyze", "build_again"]  # analyze ran once, and was kept
    assert [s.id for s in result.plan.steps] == ["analyze", "build_again"]
    assert result.replans == 1
    revisions = [e for e in events if isinstance(e, PlanRevised)]
    assert len(revisions) == 1
    assert revisions[0].step_id == "build"
    assert event_from_json(event_to_json(revisions[0])) == revisions[0]
    assert revisions[0].kept == ("analyze",)
    assert "missing.py" in revisions[0].reason
    replan = str(planner.requests[1])
    assert "Users" in replan
    assert "analyze done" in replan  # what completed, with its artifacts
    assert "missing.py" in replan  # the failure
    assert [(t.name, t.part, t.status) for t in result.tokens] == [
        ("planner", "planner", "completed"),
        ("analyze", "step", "completed"),
        ("build", "step", "failed"),
        ("replan 1", "replan", "completed"),
        ("build_again", "step", "completed"),
    ]
    assert result.artifacts["build_again"]["text"] == "build_again done"


def test_replanning_is_bounded(project: Path) -> None:
    failing = plan_json(step("a", inputs=["README.md"]))
    planner = ScriptedModel([failing, failing, failing, failing])
    generator = PlanGenerator(planner)
    plan = asyncio.run(generator.generate("Users", workspace=project))

    def broken(prompt: Prompt) -> str:
        raise RuntimeError("the worker is down")

    events: list[Event] = []
    result = asyncio.run(
        generator.execute(
            plan,
            executor=AgentExecutor(model=FunctionModel(broken)),
            workspace=project,
            listeners=[events.append],
        )
    )
    assert not result.ok
    assert result.replans == 2
    assert len([e for e in events if isinstance(e, PlanRevised)]) == 2
    assert planner.remaining == 1
    assert "the worker is down" in (result.error or "")
    none = asyncio.run(
        generator.execute(
            plan,
            executor=AgentExecutor(model=FunctionModel(broken)),
            workspace=project,
            max_replans=0,
        )
    )
    assert none.replans == 0


def test_a_replan_that_gives_no_valid_plan_ends_the_run_and_says_why(project: Path) -> None:
    plan = Plan.model_validate_json(plan_json(step("a", inputs=["ghost.py"])))
    planner = ScriptedModel(["no idea", "still no idea"])
    result = asyncio.run(
        PlanGenerator(planner).execute(
            plan, executor=AgentExecutor(model=ScriptedModel([])), workspace=project
        )
    )
    assert not result.ok
    assert "ghost.py" in (result.error or "")
    assert "no valid plan" in (result.error or "")
    assert [t.name for t in result.tokens] == ["a", "replan 1"]


def test_an_input_that_does_not_exist_is_sent_back_to_the_planner(project: Path) -> None:
    bad = plan_json(step("a", inputs=["app/ghost.py"]))
    good = plan_json(
        step("a", artifacts=["app/ghost.py"]), step("b", inputs=["app/ghost.py"], depends_on=["a"])
    )
    planner = ScriptedModel([bad, good])
    plan = generate(planner, project)
    assert [s.id for s in plan.steps] == ["a", "b"]  # made by a step it waits for: fine
    assert "input 'app/ghost.py' is not a file of the workspace" in str(planner.requests[1])


# -- tokens ------------------------------------------------------------------------------------


def test_tokens_are_reported_per_step_and_for_the_planner_and_say_how_they_were_counted(
    project: Path,
) -> None:
    generator = PlanGenerator(ScriptedModel([SIX]))
    plan = asyncio.run(generator.generate("Users", workspace=project))

    def unreported(prompt: Prompt) -> ModelCallResponse:
        return ModelCallResponse(
            message=Message.assistant(worker(prompt)), usage=Usage.of_call(None, None)
        )

    result = asyncio.run(
        generator.execute(
            plan, executor=AgentExecutor(model=FunctionModel(unreported)), workspace=project
        )
    )
    assert result.ok
    lines = {line.name: line for line in result.tokens}
    assert lines["planner"].source == "reported"
    assert lines["planner"].prompt_tokens > 0
    assert lines["auth"].source == "estimated"
    assert lines["auth"].prompt_tokens > 0
    assert lines["auth"].completion_tokens > 0
    assert result.total().source == "mixed"
    assert result.total("step").calls == 6
    report = result.token_report()
    assert "estimated" in report
    assert "planner" in report
    data = result.to_data()
    assert data["tokens"][-1]["name"] == "total"


def test_plan_run_prints_the_token_table(project: Path) -> None:
    # One model for planner and steps: a function answering both.
    def both(prompt: Prompt) -> str:
        return SIX if prompt.step_id == "plan" else worker(prompt)

    done = CliRunner().invoke(
        app,
        ["plan", "Users", "-m", "m", "--workspace", str(project), "--run"],
        obj=Settings(resolve_model=lambda spec: FunctionModel(both)),
    )
    assert done.exit_code == 0, done.output
    assert "tokens" in done.stdout
    assert "planner" in done.stdout
    assert "cleanup" in done.stdout
    as_json = CliRunner().invoke(
        app,
        ["plan", "Users", "-m", "m", "--workspace", str(project), "--run", "--json"],
        obj=Settings(resolve_model=lambda spec: FunctionModel(both)),
    )
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["status"] == "completed"
    assert [t["name"] for t in data["tokens"]][:2] == ["planner", "analyze"]


# -- property: random valid plans --------------------------------------------------------------


@st.composite
def plans(draw: st.DrawFn) -> list[tuple[str, list[str]]]:
    count = draw(st.integers(min_value=1, max_value=7))
    steps = []
    for index in range(count):
        earlier = [f"s{i}" for i in range(index)]
        deps = draw(st.lists(st.sampled_from(earlier), unique=True)) if earlier else []
        steps.append((f"s{index}", deps))
    order = draw(st.permutations(steps))
    return list(order)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_random_valid_plans_run_each_step_once_after_its_dependencies(
    shape: Sequence[tuple[str, list[str]]],
) -> None:
    plan = Plan(
        id="random",
        description="random",
        steps=[PlanStep(id=i, type="generate", goal=f"Do {i}.", depends_on=d) for i, d in shape],
    )
    events: list[Event] = []
    model = FunctionModel(lambda prompt: json.dumps({"text": prompt.step_id}))
    result = asyncio.run(
        AgentExecutor(model=model).execute(plan.to_recipe(), listeners=[events.append])
    )
    assert result.ok, result.error
    started = [str(e.step_id) for e in events if isinstance(e, StepStarted)]
    assert sorted(started) == sorted(dict(shape))  # each step once
    completed: set[str] = set()
    for event in events:
        if isinstance(event, StepStarted):
            assert set(dict(shape)[str(event.step_id)]) <= completed
        if isinstance(event, StepCompleted):
            completed.add(str(event.step_id))
    assert len(model.requests) == len(shape)  # each step called its model exactly once


def test_a_plan_run_reads_existing_inputs_up_front_and_takes_new_files_from_dependencies(
    project: Path,
) -> None:
    plan = Plan.model_validate_json(
        plan_json(
            step("a", artifacts=["app/new.py"]),
            step("b", "validate", inputs=["app/new.py", "README.md"], depends_on=["a"]),
        )
    )
    prompts: dict[str, str] = {}

    def model(prompt: Prompt) -> str:
        prompts[prompt.step_id or ""] = str(prompt)
        files = [{"path": "app/new.py", "content": "NEW = 1\n"}] if prompt.step_id == "a" else []
        return json.dumps({"text": "ok", "files": files})

    result = asyncio.run(
        PlanGenerator(ScriptedModel([])).execute(
            plan, executor=AgentExecutor(model=FunctionModel(model)), workspace=project
        )
    )
    assert result.ok, result.error
    assert prompts["b"].count("NEW = 1") == 1  # the new file, once, from its dependency
    assert "A small web app." in prompts["b"]  # read before the run started
    assert [c.name for c in result.executions["b"].tool_calls] == []
    assert (project / "app" / "new.py").read_text() == "NEW = 1\n"


@pytest.mark.parametrize("reject", [(), ("response_format",), ("response_format", "tools")])
def test_plans_work_over_http_in_every_rung_of_the_output_ladder(
    project: Path, reject: tuple[str, ...]
) -> None:
    """The planner and the steps answer through the real provider (the `openai` client over
    HTTP), whether the server takes a JSON Schema, only tool calls, or neither."""
    small = plan_json(
        step("analyze", "analyze", inputs=["README.md"]),
        step("user_model", inputs=["app/models.py"], depends_on=["analyze"]),
    )

    def reply(request: FakeRequest) -> FakeReply:
        text = json.dumps(request.body.get("messages"))
        if "Requirements:" in text:
            return FakeReply.structured(json.loads(small))
        step_id = "user_model" if "Step (generate)" in text else "analyze"
        return FakeReply.structured(
            {"text": f"{step_id} done", "files": [{"path": f"{step_id}.md", "content": "x"}]}
        )

    with FakeOpenAIServer(reply, reject=set(reject)) as server:
        generator = PlanGenerator(server.model())
        plan = asyncio.run(generator.generate("Users", workspace=project))
        result = asyncio.run(
            generator.execute(plan, executor=AgentExecutor(model=server.model()), workspace=project)
        )
    assert result.ok, result.error
    assert result.artifacts["user_model"]["text"] == "user_model done"
    assert (project / "user_model.md").read_text() == "x"
    assert all(line.source == "reported" for line in result.tokens)


def test_yaml_task_steps_are_checked_like_any_step() -> None:
    with pytest.raises(RecipeError, match="give the step a `type`"):
        parse_recipe("id: r\nsteps:\n  - id: a\n    goal: Do a.\n    reads: [x.py]\n")
    with pytest.raises(RecipeError, match="needs a `goal`"):
        parse_recipe("id: r\nsteps:\n  - id: a\n    tool: read_file\n    type: analyze\n")
    recipe = parse_recipe(
        "id: r\nsteps:\n  - id: a\n    type: modify\n    goal: Fix it.\n    reads: x.py\n"
        "    artifacts: [x.py]\n"
    )
    assert recipe.step("a").kind == "task"


def test_tools_from_a_module_reach_the_steps_and_the_yaml(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "shop_tools.py").write_text(
        "from minions import tool\n\n\n@tool\ndef price(name: str) -> int:\n"
        '    """The price of a product.\n\n    Args:\n        name: the product.\n    """\n'
        "    return 3\n"
    )
    answer = plan_json(step("a", "analyze", tools=["price"]))
    file = project / "plan.yaml"
    monkeypatch.chdir(project)
    done = CliRunner().invoke(
        app,
        ["plan", "Prices", "-m", "m", "--tools", "shop_tools", "-o", str(file)],
        obj=Settings(resolve_model=lambda spec: ScriptedModel([answer])),
    )
    assert done.exit_code == 0, done.output
    assert "tools:\n- shop_tools\n" in file.read_text()
    recipe = load_recipe(file)
    assert recipe.step("a").tool_names() == {"price"}


def test_a_plan_is_a_plan_span_holding_the_planners_run() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    planner = ScriptedModel([plan_json(step("analyze", "analyze"), step("write"))])
    generator = PlanGenerator(planner, tracer_provider=provider)
    asyncio.run(generator.generate("Create a user management system", tools=[]))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    plan, run = spans["plan"], spans["invoke_workflow planner"]
    assert plan.attributes is not None
    assert plan.attributes["gen_ai.operation.name"] == "plan"
    assert plan.attributes["minions.plan.request"] == "plan"
    assert run.parent is not None
    assert run.parent.span_id == plan.context.span_id
    assert any(n.startswith("chat ") for n in spans)


def test_a_step_that_leaves_out_a_promised_file_is_asked_again_then_fails(project: Path) -> None:
    plan = Plan.model_validate_json(plan_json(step("user", artifacts=["app/user.py", "notes"])))
    without = json.dumps({"text": "I thought about it."})
    with_file = json.dumps(
        {"text": "done", "files": [{"path": "app/user.py", "content": "class User: ...\n"}]}
    )
    model = ScriptedModel([without, with_file])
    result = asyncio.run(AgentExecutor(model=model).execute(plan.to_recipe(workspace=project)))
    assert result.ok, result.error
    assert (project / "app" / "user.py").read_text() == "class User: ...\n"
    assert "no file 'app/user.py'" in model.requests[1].messages[-1].content  # the re-ask
    stubborn = ScriptedModel([without, without, without])
    failed = asyncio.run(AgentExecutor(model=stubborn).execute(plan.to_recipe(workspace=project)))
    assert failed.step("user").status is StepStatus.FAILED
    assert "app/user.py" in (failed.step("user").error or "")
