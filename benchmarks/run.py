"""Run benchmark workloads, each in its own fresh process; one JSON line per variant.

    python benchmarks/run.py            # every workload
    python benchmarks/run.py W2 W5      # some of them
    python benchmarks/run.py W1-OTEL    # W1 with OpenTelemetry tracing on

Workloads are defined in ../shared/benchmarks/WORKLOADS.md (see docs/benchmarks.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
WORKLOADS = {
    "W1": "w1_linear_chain.py",
    "W1-OTEL": "w1_traced.py",
    "W2": "w2_tool_loop.py",
    "W3": "w3_parallel.py",
    "W4": "w4_structured_output.py",
    "W5": "w5_memory.py",
    "IMPORT": "import_time.py",
    "TOKENS": "tokens.py",
    "VALIDATE": "validate_big.py",
    "W6": "w6_durable.py",
    "PLAN": "plan.py",
    "MCP": "mcp_tools.py",
    "SERVICE": "service.py",
    "RERUN": "rerun.py",
    "EVAL": "evals.py",
    "IDLE": "idle.py",
    "STREAMS": "streams.py",
}


def main(argv: list[str]) -> int:
    names = [a.upper() for a in argv] or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(
            f"unknown workload(s): {', '.join(unknown)}; known: {', '.join(WORKLOADS)}",
            file=sys.stderr,
        )
        return 2
    status = 0
    for name in names:
        script = HERE / WORKLOADS[name]
        if not script.exists():
            print(f"{name}: {script.name} is not written yet", file=sys.stderr)
            continue
        print(f"running {name} ({script.name})...", file=sys.stderr, flush=True)
        result = subprocess.run([sys.executable, str(script)], check=False)
        if result.returncode != 0:
            print(f"{name} failed with exit code {result.returncode}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
