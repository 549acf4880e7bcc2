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
