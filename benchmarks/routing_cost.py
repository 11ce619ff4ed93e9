"""What choosing a replica costs the gateway per request (gateway.serving.routing), in CPU time.

    PYTHONPATH=. .venv/bin/python benchmarks/routing_cost.py [--bound 10000] [--rounds 20000]

For pools of 1, 2 and 4 replicas, each with ``--bound`` other conversations already bound, it times
``Pool.route`` plus the placement's release, on the real agents' recorded requests
(tests/data/agent-requests): a later turn of a known conversation, a Claude Code subagent (placed by its
parent) and a new conversation with no id (Qwen Code: placed by load and the prefix each replica
holds). The prompt's units are cut once beforehand, as the handler cuts them for the scheduler anyway.
Reported: microseconds per request (median of five runs).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

from gateway.serving.dialects.prompt_prefix import strip_billing_header
from gateway.serving.routing.pool import Pool, Replica
from gateway.serving.scheduling.sessions import PromptUnits, identify, prompt_units

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "data" / "agent-requests"


def request(agent: str, number: int, **headers: str) -> tuple[dict[str, str], str, PromptUnits]:
    (path,) = RECORDED.glob(f"{agent}/{number:02d}-*.json")
    recorded = json.loads(path.read_text())
    body: dict[str, Any] = copy.deepcopy(recorded["body"])
    strip_billing_header(body)
    units = prompt_units(body)
    sent = {**recorded["headers"], **headers}
    return sent, identify(sent, body, units, None).session, units


def per_request_us(pool: Pool[str], case: tuple[dict[str, str], str, PromptUnits], rounds: int) -> float:
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(rounds):
            pool.route(*case).release()
        runs.append((time.perf_counter() - started) / rounds * 1e6)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=int, default=10_000, help="other conversations bound beforehand")
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()
    cases = {
        "later turn (Claude Code)": request("claude", 3),
        "subagent (Claude Code)": request("claude", 3, **{"x-claude-code-agent-id": "a7c1"}),
        "new, no id (Qwen Code)": request("qwen", 1),
    }
    print(f"| replicas | {' | '.join(cases)} |")
    print(f"|---|{'---|' * len(cases)}")
    for count in (1, 2, 4):
        pool: Pool[str] = Pool(Replica(f"r{index}", f"r{index}") for index in range(count))
        for number in range(args.bound):
            pool.bindings.bind(f"other-{number}", f"r{number % count}", 0, conversation=True)
        pool.route(*request("claude", 2)).release()  # the conversation the later turn continues
        figures = [per_request_us(pool, case, args.rounds) for case in cases.values()]
        print(f"| {count} | {' | '.join(f'{figure:.1f} µs' for figure in figures)} |")


if __name__ == "__main__":
    main()
