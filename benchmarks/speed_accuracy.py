"""The plan's decode estimate against the engine's own measured speed, for every configuration this
machine can run: the default model on the CPU with the native llama-server and with
llama-cpp-python, and pooled over two loopback RPC workers.

    .venv/bin/python benchmarks/speed_accuracy.py [--requests N] [--max-tokens N] [--json FILE]

Each case is ``gateway serve`` with a fresh state directory: its plan's estimate for the chosen
configuration (``speed.estimated`` on ``/status``), the engine's own timings over the requests
(``speed.measured``, summed from its "eval time" log lines: the figure the gateway stores with the
remembered configuration), their ratio, and the estimate a second ``gateway plan`` makes once the
measurement is remembered (the CPU term calibrated; 1.00 means it now predicts what was measured).
The load average is printed: on a shared machine other processes take the cores the estimate assumes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.rpc_vs_local import KEY, free_port, loopback_workers, measure, process, wait_ok


def replan_estimate(state: Path, extra: list[str]) -> float | None:
    """The chosen llama.cpp candidate's estimate from `gateway plan --json` with this state directory."""
    argv = [sys.executable, "-m", "gateway", "plan", "--json", "--context-length", "4096", "--state-dir", str(state)]
    out = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=300, check=False)
    try:
        plan = json.loads(out.stdout)
    except ValueError:
        return None
    index = plan["decision"].get("candidate")
    candidates = [c for c in plan["candidates"] if c["backend"] == "llamacpp"]
    chosen = candidates[index] if isinstance(index, int) and index < len(candidates) else None
    return float(chosen["tokens_per_s_estimate"]) if chosen else None


def case(workdir: Path, label: str, extra: list[str], requests: int, max_tokens: int, threads: int) -> dict[str, Any]:
    port = free_port()
    state = workdir / f"state-{label.replace(' ', '-').replace(',', '')}"
    log = workdir / f"{state.name}.log"
    argv = [
        sys.executable, "-m", "gateway", "serve", "--port", str(port), "--context-length", "4096",
        "--state-dir", str(state), "--replan", "--threads", str(threads), *extra,
    ]  # fmt: skip
    load_before = os.getloadavg()[0]
    with process(argv, log) as proc:
        wait_ok(f"http://127.0.0.1:{port}/ready", proc, log)
        answered = measure(f"http://127.0.0.1:{port}", requests, max_tokens)
        status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json()
    speed = status.get("speed") or {}
    measured = (speed.get("measured") or {}).get("decode_tokens_per_s")
    estimated = speed.get("estimated")
    plan_extra = [a for a in extra if a not in ("--replan",)]
    return {
        "case": label,
        "summary": (status.get("backend") or {}).get("summary"),
        "estimated": estimated,
        "measured_decode": measured,
        "measured_prompt": (speed.get("measured") or {}).get("prompt_tokens_per_s"),
        "answer_timings_decode": answered["decode_tokens_per_s"],
        "estimate_over_measured": round(estimated / measured, 2) if estimated and measured else None,
        "replanned_estimate": replan_estimate(state, plan_extra),
        "threads": threads,
        "load_average": round((load_before + os.getloadavg()[0]) / 2, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-rpc", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp threads of the head")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="speed-accuracy-") as tmp:
        workdir = Path(tmp)
        rows.append(
            case(
                workdir,
                "CPU, llama-server",
                ["--llama-launcher", "native"],
                args.requests,
                args.max_tokens,
                args.threads,
            )
        )
        rows.append(
            case(
                workdir,
                "CPU, llama-cpp-python",
                ["--llama-launcher", "python"],
                args.requests,
                args.max_tokens,
                args.threads,
            )
        )
        if not args.no_rpc:
            with contextlib.ExitStack() as stack:
                workers = loopback_workers(stack, workdir)
                extra = ["--llama-launcher", "native", "--workers", ",".join(workers), "--worker-api-key", KEY]
                rows.append(
                    case(workdir, "RPC, 2 loopback workers", extra, args.requests, args.max_tokens, args.threads)
                )
    print("| case | estimated tok/s | measured decode | measured prompt | estimate/measured | re-planned | load |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['case']} | {row['estimated']} | {row['measured_decode']} | {row['measured_prompt']} | "
            f"{row['estimate_over_measured']} | {row['replanned_estimate']} | {row['load_average']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(re.match(r"\d", str(r["measured_decode"])) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
