"""``--notify`` of `minions serve` and `minions worker`: the options, and the notifier they
run beside their work (`minions.runs.Notifier`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from minions.cli._errors import UsageError

if TYPE_CHECKING:
    from minions.runs import Notifier

__all__: list[str] = []

NotifyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--notify",
        metavar="[KINDS=]URL",
        help="POST a signed JSON notification to URL when a run failed, waits for approval, "
        "is stuck, or a schedule fired a slot late or skipped one; KINDS limits it "
        "(failed,waiting,stuck,late=URL). Repeatable. Signed with HMAC-SHA256 of "
        "$MINIONS_NOTIFY_SECRET (required).",
        show_default=False,
    ),
]
StuckAfterOption = Annotated[
    str,
    typer.Option(
        "--notify-stuck-after",
        metavar="DURATION",
        help="A run a worker holds with no progress (no event) for this long is stuck, "
        "unless each of its steps in flight waits for its endpoint's limits or a decision.",
    ),
]


def notifier(url: str, notify: list[str] | None, *, stuck_after: str) -> Notifier | None:
    """The notifier `notify` asks for over the store at `url`, started (None: none asked).

    Raises:
        UsageError: a bad target or duration, or no secret.
    """
    if not notify:
        return None
    from minions._duration import duration_seconds
    from minions.runs import Notifier, NotifyTarget

    try:
        targets = [NotifyTarget.parse(given) for given in notify]
    except ValueError as exc:
        raise UsageError(f"--notify {exc}") from None
    try:
        stuck = duration_seconds(stuck_after)
    except ValueError as exc:
        raise UsageError(f"--notify-stuck-after: {exc}") from None
    try:
        made = Notifier(url, targets, stuck_after=stuck)
    except ValueError as exc:
        raise UsageError(f"--notify: {exc}") from None
    return made.start()
