"""Plan and execute: a model turns requirements into a plan, and each step runs with only what
it needs (its goal, the files it names, its dependencies' artifacts).

The seed's example: "Create a user management system with authentication" over the small shop
in ``project/``. The run works on a copy of the project (``--workspace DIR`` to choose where),
writes the plan's files there, and ends with the token report.

Offline (the default), every model call is answered from ``recording.json``::

    python examples/plan_and_execute/run.py

Live, with any model string (see docs/local-models.md)::

    python examples/plan_and_execute/run.py --model ollama:llama3.2:3b
    python examples/plan_and_execute/run.py --model openai:gpt-4o-mini --record

``--record`` saves the live run's replies as the new ``recording.json``; ``--stand-in
--record`` remakes it with the stand-in model of ``stand_in.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from minions import AgentExecutor, Model, PlanGenerator, PlanResult
from minions.models import Recording, RecordingModel, ReplayModel, infer_model
from minions.testing import FunctionModel

HERE = Path(__file__).parent
RECORDING = HERE / "recording.json"
REQUIREMENTS = "Create a user management system with authentication"


def stand_in() -> Model:
    spec = importlib.util.spec_from_file_location("_plan_stand_in", HERE / "stand_in.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return FunctionModel(module.reply, name="stand-in")


async def plan_and_run(model: Model, workspace: Path) -> PlanResult:
    """Plan the requirements over `workspace`, print the plan, run it."""
    generator = PlanGenerator(model)
    plan = await generator.generate(REQUIREMENTS, workspace=workspace)
    print(f"plan {plan.id}: {plan.description}")
    for step in plan.steps:
        after = f" after {', '.join(step.depends_on)}" if step.depends_on else ""
        reads = f" reading {', '.join(step.inputs)}" if step.inputs else ""
        print(f"  {step.id} ({step.type}){after}{reads}")
    return await generator.execute(
        plan,
        executor=AgentExecutor(model=model),
        requirements=REQUIREMENTS,
        workspace=workspace,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model string; default: replay recording.json")
    parser.add_argument("--stand-in", action="store_true", help="use the stand-in model")
    parser.add_argument("--record", action="store_true", help="save the replies as recording")
    parser.add_argument("--workspace", type=Path, help="where to copy the project and work")
    args = parser.parse_args(argv)
    recording: Recording | None = None
    model: Model
    if args.model or args.stand_in:
        model = infer_model(args.model) if args.model else stand_in()
        if args.record:
            recording = Recording(meta={"example": "plan_and_execute"})
            model = RecordingModel(model, recording)
    else:
        model = ReplayModel(RECORDING)
    with tempfile.TemporaryDirectory(prefix="minions-plan-") as scratch:
        workspace: Path = args.workspace or Path(scratch) / "project"
        shutil.copytree(HERE / "project", workspace, dirs_exist_ok=True)
        result = asyncio.run(plan_and_run(model, workspace))
        print()
        print(result.token_report())
        written = sorted(
            str(p.relative_to(workspace))
            for p in workspace.rglob("*.py")
            if not (HERE / "project" / p.relative_to(workspace)).exists()
        )
        print(
            f"\n{'completed' if result.ok else 'failed: ' + str(result.error)}; "
            f"files written: {', '.join(written) or 'none'}"
        )
    if recording is not None:
        recording.save(RECORDING)
        print(f"recorded {len(recording)} replies to {RECORDING}")
    return 0 if result.ok else 1


def summary(result: PlanResult) -> dict[str, Any]:
    """What a test checks of a run."""
    return {"ok": result.ok, "steps": list(result.executions), "replans": result.replans}


if __name__ == "__main__":
    sys.exit(main())
