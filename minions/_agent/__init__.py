"""The agent layer (internal): runs a recipe's steps as a graph.

* `graph.py`: `StepGraph`, a recipe checked, with its edges; `validation.py` finds the problems,
  `mermaid.py` draws it.
* `manager.py`: `StepManager`, ready, running, done and skipped steps; advancing a run.
* `executor.py`: `AgentExecutor`, the public entry point; `run.py` is one run's machinery and
  `stream.py` its event stream.
"""
