"""From a stored run to a case: `add_case` appends it to a dataset file as text, keeping the
file's comments and layout."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions._text import jsonable
from minions.errors import Problem
from minions.evals._dataset import DatasetError, case_id_problem

if TYPE_CHECKING:
    from minions.models import Recording
    from minions.runs import RunRecord

__all__ = ["add_case", "case_text"]


def _flow(value: Any) -> str:
    """A value as one line of YAML: JSON, which YAML reads as it is."""
    return json.dumps(jsonable(value), ensure_ascii=False)


def case_text(
    case_id: str,
    inputs: Mapping[str, Any],
    *,
    expected: Any = None,
    has_expected: bool = True,
    comment: str = "",
    indent: str = "  ",
) -> str:
    """A case as YAML lines, each item key at `indent` (the list's own indentation)."""
    lines = [f"{indent}# {line}" for line in comment.splitlines()]
    lines.append(f"{indent}- id: {_flow(case_id)}")
    lines.append(f"{indent}  inputs: {_flow(dict(inputs))}")
    if has_expected:
        lines.append(f"{indent}  expected: {_flow(expected)}")
    return "\n".join(lines) + "\n"


def _cases_block(text: str) -> tuple[int, str]:
    """Where to insert a case (the index of the line after the last line of the ``cases:``
    list) and the list items' indentation."""
    from minions._yaml import load_yaml

    located = load_yaml(text)
    data = located.data
    if not isinstance(data, Mapping) or not isinstance(data.get("cases"), list):
        raise ValueError("it has no list of cases")
    lines = text.splitlines()
    key_line = located.line(("cases",))
    first = located.line(("cases", 0))
    if key_line is None or first is None:
        raise ValueError("its cases cannot be found")
    item = lines[first - 1]
    if not item.lstrip().startswith("-"):
        raise ValueError("its cases are not a block list (one '- ' item per case)")
    indent = item[: len(item) - len(item.lstrip())]
    key_indent = len(lines[key_line - 1]) - len(lines[key_line - 1].lstrip())
    end = first  # index after the last line of the list
    for index in range(first, len(lines)):
        line = lines[index]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        depth = len(line) - len(line.lstrip())
        if depth < len(indent) or (depth <= key_indent and not stripped.startswith("-")):
            break
        end = index + 1
    return end, indent


def add_case(
    record: RunRecord,
    dataset: str | Path,
    *,
    case_id: str | None = None,
    recording: Recording | None = None,
    recordings: str | Path | None = None,
) -> str:
    """Append a case made of a stored run to a dataset file: the run's inputs, and its output
    as `expected` (check it: a bad run's output is what it should *not* say). The file is
    not rewritten: the case is inserted as text after the last case, so comments and layout
    stay; the new text is checked before the file is replaced. Returns the case id.

    Args:
        record: the run (``await RunStore().get(run_id)``).
        dataset: the dataset file.
        case_id: the case's id (default ``run-`` and the run id's first 8 characters).
        recording: the run's recording, kept as the case's first run's in `recordings`.
        recordings: the eval's recordings folder (``--replay DIR``).

    Raises:
        DatasetError: the file cannot be read or changed, the id is taken or invalid.
    """
    from minions.evals._load import parse_dataset

    file = Path(dataset)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError([Problem(message=f"cannot read: {exc}", file=str(file))]) from None
    new_id = case_id or f"run-{record.run_id[:8]}"
    problem = case_id_problem(new_id)
    if problem:
        raise DatasetError([Problem(message=problem, file=str(file), field="--id")])
    if re.search(rf"^\s*-\s*id:\s*[\"']?{re.escape(new_id)}[\"']?\s*$", text, re.M):
        raise DatasetError(
            [
                Problem(
                    message=f"a case has the id {new_id!r} already: give another with --id",
                    file=str(file),
                )
            ]
        )
    try:
        end, indent = _cases_block(text)
    except ValueError as exc:
        raise DatasetError([Problem(message=f"cannot add a case: {exc}", file=str(file))]) from None
    when = time.strftime("%Y-%m-%d", time.localtime(record.created_at))
    status = record.status if record.status != "failed" else f"failed: {record.error}"
    ok = record.status == "completed"
    comment = f"from run {record.run_id} of {record.recipe_id} ({status}, {when})"
    if ok:
        comment += ": check that `expected` is what it should be"
    block = case_text(
        new_id,
        record.inputs,
        expected=record.output,
        has_expected=ok,
        comment=comment,
        indent=indent,
    )
    lines = text.splitlines(keepends=True)
    if end > 0 and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    updated = "".join([*lines[:end], block, *lines[end:]])
    parse_dataset(updated, path=file)  # the dataset with the case is valid, or nothing changes
    if recording is not None and recordings is not None:
        target = Path(recordings) / new_id / "1.recording.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        recording.save(target)
    _replace(file, updated)
    return new_id


def _replace(file: Path, text: str) -> None:
    """Write `text` to `file` at once (a crash leaves the old file or the new, never half)."""
    handle, name = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(name, file)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
