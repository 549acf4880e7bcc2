"""Every ```python block in README.md and docs/ runs as written, and prints what it says.

Blocks of one file run in order in one namespace, so a page can build on earlier blocks.
A block whose first line is `# doc: no-run` (one needing a real model, say) is skipped.
A block that prints is followed by a ```text block holding exactly what it prints; ``...`` in
that text stands for any text (a time, an id).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCK = re.compile(
    r"^```python\n(?P<code>.*?)^```\n(?:\n*^```text\n(?P<prints>.*?)^```)?",
    re.DOTALL | re.MULTILINE,
)


def _matches(printed: str, expected: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, printed, re.DOTALL) is not None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MINIONS_MODEL", raising=False)
    namespace: dict[str, object] = {"__name__": f"doc_{page.stem}"}
    for number, found in enumerate(BLOCK.finditer(page.read_text()), start=1):
        block, expected = found["code"], found["prints"]
        if block.startswith("# doc: no-run"):
            continue
        code = compile(block, f"{page.name} block {number}", "exec")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(code, namespace)
        where = f"{page.name} block {number}"
        if expected is None:
            assert printed.getvalue() == "", f"{where} prints, but no ```text block says what"
        else:
            assert _matches(printed.getvalue(), expected), (
                f"{where} printed:\n{printed.getvalue()}\nthe page says:\n{expected}"
            )


def quickstart_commands() -> list[str]:
    """The commands of the README's Quickstart: its ```bash blocks, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.DOTALL | re.MULTILINE)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_quickstart_is_two_commands_and_ci_runs_the_second() -> None:
    demo, check = quickstart_commands()
    assert demo == "make demo"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line.strip() for line in ci if line.strip() and not line.startswith("#")]
    assert commands[-1] == check
