"""IMPORT — `python -c "import minions"` in a fresh process, minus `python -c pass`.

1 warm-up, then 5 timed runs of each. An extra variant imports the names a typical program
uses, since a package could look fast by importing nothing.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from _common import emit, mark_imported, summary

mark_imported()


def run(code: str) -> list[float]:
    times = []
    for i in range(6):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        if i > 0:
            times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    baseline = run("pass")
    base = statistics.median(baseline)
    variants = {
        "import minions": "import minions",
        "typical program": (
            "from minions import AgentContext, DefaultStep, StepExecutor, OutputInstructions, tool"
        ),
    }
    for i, (variant, code) in enumerate(variants.items()):
        net = [t - base for t in run(code)]
        emit(
            "IMPORT",
            variant,
            primary="net_import_ms",
            headline=i == 0,
            metrics={"net_import_ms": summary(net, "ms")},
            extra={"python_pass_ms": round(base, 1)},
        )


if __name__ == "__main__":
    main()
