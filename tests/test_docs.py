"""Every ```python block in README.md and docs/ runs as written.

Blocks of one file run in order in one namespace, so a page can build on earlier blocks.
A block whose first line is `# doc: no-run` (one needing a real model, say) is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MINIONS_MODEL", raising=False)
    namespace: dict[str, object] = {"__name__": f"doc_{page.stem}"}
    for number, block in enumerate(BLOCK.findall(page.read_text()), start=1):
        if block.startswith("# doc: no-run"):
            continue
        code = compile(block, f"{page.name} block {number}", "exec")
        exec(code, namespace)
