"""OpenTelemetry spans of runs, following the GenAI semantic conventions (``minions[otel]``)."""

__all__: list[str] = []
