"""Replays published engine start-up logs through the planner: predicted vs reported, term by term.

    .venv/bin/python benchmarks/plan_accuracy.py [--json out.json]

Cases come from tests/data/memory-cases-dev.json (copied from the research data). A case is replayed
when its inputs are complete enough (model architecture, GPU size, flags); the others are listed
with what is missing. Per-case inputs the JSON gives only in prose (engine version, quantization,
GPU size when given in another unit) are transcribed in REPLAY below, each with its source.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.replay.plan_accuracy import replay_all


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows, caveats, skipped, excluded = replay_all()
    width = max(len(r.term) for r in rows)
    print(f"{'case':<9} {'term':<{width}} {'predicted':>12} {'reported':>12} {'error':>8}")
    for row in rows:
        error = f"{row.error:+8.1%}" if row.reported else ("    ok" if row.predicted == row.reported else "  WRONG")
        print(f"{row.case:<9} {row.term:<{width}} {row.predicted:12,.2f} {row.reported:12,.2f} {error:>8}")
    kv_rows = [r for r in rows if r.term in ("available KV GiB", "KV tokens") and r.case not in excluded]
    verdicts = [r for r in rows if r.term.startswith("verdict") and r.case not in excluded]
    exact_rows = [r for r in rows if r.term.startswith(("KV for one", "estimated max", "KV cache MiB"))]
    within = sum(abs(r.error) <= 0.10 for r in kv_rows)
    print(
        f"\navailable KV and KV tokens within ±10%: {within}/{len(kv_rows)} (excluded: {', '.join(sorted(excluded))})"
    )
    exact = sum(abs(r.error) <= 0.01 for r in exact_rows)
    print(f"exact KV arithmetic (max-length errors, llama.cpp KV) within ±1%: {exact}/{len(exact_rows)}")
    right = sum(r.predicted == r.reported for r in verdicts)
    print(f"fit / no-fit verdict right: {right}/{len(verdicts)}")
    totals = [r for r in rows if r.term == "CUDA total GiB"]
    close = sum(abs(r.predicted - r.reported) <= 0.07 for r in totals)
    print(f"CUDA total from NVML's within 0.07 GiB of the logged one: {close}/{len(totals)}")
    for caveat in caveats:
        print(f"caveat {caveat}")
    for skip in skipped:
        print(f"skipped {skip}")
    if args.json:
        args.json.write_text(json.dumps([row.__dict__ | {"error": row.error} for row in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
