"""Plans from requirements (internal): a planner writes a `Plan` through structured output
(`plan.py`), `PlanGenerator` checks it, runs it and replans what is left when a step fails
(`generator.py`), and `PlanResult` reports what ran and its tokens (`result.py`).

This layer sits above the agent layer, whose `AgentExecutor` runs a plan's recipe, and below
the CLI (`minions plan`).
"""
