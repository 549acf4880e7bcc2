"""Make the recordings of the capitals eval with the stand-in models (see stand_in.py):

python examples/evals/record.py
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from stand_in import judge, reply  # noqa: E402

from minions.evals import evaluate_sync, load_dataset  # noqa: E402
from minions.testing import FunctionModel  # noqa: E402


def main() -> None:
    recordings = HERE / "recordings"
    shutil.rmtree(recordings, ignore_errors=True)
    report = evaluate_sync(
        load_dataset(HERE / "capitals.eval.yaml"),
        model=FunctionModel(reply, name="stand-in"),
        judge_model=FunctionModel(judge, name="stand-in-judge"),
        record=recordings,
        concurrency=1,
    )
    print(
        f"recorded {report.runs} case runs to {recordings}: {report.passed} passed, "
        f"{report.failed} failed, {report.errors} errors"
    )


if __name__ == "__main__":
    main()
