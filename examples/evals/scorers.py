"""Scorers of the capitals dataset (``python: scorers:one_word``): each gets the case run and
returns True/False, or (passed, reason)."""

from minions.evals import CaseRun


def one_word(run: CaseRun) -> tuple[bool, str]:
    """The answer is one word, as the recipe asks."""
    words = str(run.output).split()
    return len(words) == 1, f"the answer has {len(words)} words"
