"""Step kinds beyond the agent step (internal): a direct tool call (`tool.py`), one structured
analysis (`analysis.py`), a loop (`loop.py`). All are `Step` subclasses, so they run in the same
`StepExecutor` (events, usage, timeouts, failure handling) and compose like any other step.
"""
