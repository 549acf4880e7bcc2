"""Values as text, URLs without their credentials, and the token estimate."""

from __future__ import annotations

import pytest

from minions._text import as_text, estimate_tokens, redact_url


def test_as_text_writes_strings_as_they_are_and_the_rest_as_json() -> None:
    assert as_text("plain") == "plain"
    assert as_text({"a": (1, 2)}) == '{"a": [1, 2]}'
    assert as_text([1], indent=1) == "[\n 1\n]"


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("http://user:pass@host:8080/v1", "http://***@host:8080/v1"),
        ("ollama:m@https://tok@gpu-box/v1", "ollama:m@https://***@gpu-box/v1"),
        ("http://h/v1?key=abc&model=m", "http://h/v1?key=***&model=m"),
        ("http://h/v1?model=m&access_token=abc#x", "http://h/v1?model=m&access_token=***#x"),
        ("http://h/v1?model=m", "http://h/v1?model=m"),
    ],
)
def test_redact_url_hides_credentials(given: str, shown: str) -> None:
    assert redact_url(given) == shown


def test_estimate_tokens_is_about_four_characters_a_token_and_public_in_testing() -> None:
    import minions.testing

    assert [estimate_tokens(text) for text in ("", "abcd", "abcde", "x" * 400)] == [1, 1, 2, 100]
    # The test doubles and a plan's token report count with the same function.
    assert minions.testing.estimate_tokens is estimate_tokens


def test_a_stored_event_holds_previews_of_long_results_and_outputs() -> None:
    """A run's log keeps a result once: events cut what is long, the run holds it whole."""
    from minions._text import PREVIEW_CHARS, stored_event
    from minions.events import (
        ApprovalRequested,
        RunCompleted,
        StepCompleted,
        ToolCallCompleted,
        ToolCallStarted,
    )

    long = "y" * (PREVIEW_CHARS + 1)
    note = f"\n[cut: {PREVIEW_CHARS + 1:,} characters, showing the first {PREVIEW_CHARS:,}]"
    completed = stored_event(ToolCallCompleted(content=long))
    assert isinstance(completed, ToolCallCompleted)
    assert completed.content == long[:PREVIEW_CHARS] + note
    step = stored_event(StepCompleted(output={"data": "z" * PREVIEW_CHARS}))
    assert isinstance(step, StepCompleted)
    assert step.output.startswith('{"data": "zzz')
    assert "[cut: " in step.output
    run = stored_event(RunCompleted(output=long))
    assert isinstance(run, RunCompleted)
    assert run.output == long[:PREVIEW_CHARS] + note
    started = stored_event(ToolCallStarted(arguments={"content": long, "path": "a.txt"}))
    assert isinstance(started, ToolCallStarted)
    assert started.arguments == {"content": long[:PREVIEW_CHARS] + note, "path": "a.txt"}
    asked = stored_event(ApprovalRequested(arguments={"n": 1, "text": long}))
    assert isinstance(asked, ApprovalRequested)
    assert asked.arguments["text"].endswith(note)
    # What is short enough is kept as it is, the very same event.
    for short in (
        ToolCallCompleted(content="ok"),
        StepCompleted(output={"a": 1}),
        RunCompleted(output=None),
        ToolCallStarted(arguments={"path": "a.txt"}),
    ):
        assert stored_event(short) is short
