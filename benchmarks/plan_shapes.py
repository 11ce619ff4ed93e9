"""One engine or replicas, on paper: every shape the plan weighs for a few rigs, with the figures it weighs
(context, sessions kept warm at an agent's typical prompt, aggregate decode with the sessions asked for at
once) and the one it chooses (issue 50; README "More than one engine").

    .venv/bin/python benchmarks/plan_shapes.py [--markdown]

Each case is `gateway plan` on a simulated machine (``--gpus``, ``--remote-gpus``) against the local test hub
(a NAMED stand-in for huggingface.co, as in plan_table.py), vLLM 0.32.0 and the native llama-server. The
figures are the plan's estimates, not measurements.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.getcwd())

RAM = "64GiB"
# (rig, model, --gpus, --remote-gpus, sessions)
CASES: list[tuple[str, str, str, str | None, int]] = [
    ("seed rig: 1 node × 2×32 GB", "glm-4.7-flash", "2x32GiB@12.0", None, 4),
    ("seed rig: 1 node × 2×32 GB", "glm-4.7-flash", "2x32GiB@12.0", None, 16),
    ("seed rig + a second one", "glm-4.7-flash", "2x32GiB@12.0", "node2=2x32GiB@12.0", 8),
    ("seed rig + a second one", "glm-4.7-flash", "2x32GiB@12.0", "node2=2x32GiB@12.0", 16),
    ("1 node × 4×48 GB, fits on 2", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "4x48GiB@8.9", None, 4),
    ("1 node × 4×48 GB, fits on 2", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "4x48GiB@8.9", None, 16),
    ("1 node × 4×48 GB, fits on 2", "glm-4.7-flash", "4x48GiB@8.9", None, 16),
    ("1 node × 4×48 GB, fits on 2", "google/gemma-3-27b-it", "4x48GiB@8.9", None, 16),
]


def shapes(model: str, gpus: str, remote: str | None, sessions: int) -> list[dict[str, Any]]:
    """Every shape weighed for one case, the chosen one first (its ``chosen`` True)."""
    from gateway.cli.full_settings import Settings
    from gateway.core.devices import inventory
    from gateway.nodes.pooled import with_other_nodes
    from gateway.planning.catalog import builtin_catalog
    from gateway.planning.from_settings import plan_for

    settings = Settings(model=model, sessions=sessions, llama_launcher="native", vllm_version="0.32.0")
    machine = with_other_nodes(inventory(gpus, RAM), settings, remote)
    plan = plan_for(settings, builtin_catalog().resolve(model), machine, serving=False)
    shaped = plan.replication
    if shaped is None:
        return []
    rows = []
    for kind, shape in (("chosen", shaped.chosen), ("other", shaped.other), ("pooled", shaped.pooled)):
        if shape is not None:
            rows.append({"kind": kind, "shape": shape})
    rows += [{"kind": "weighed", "shape": shape} for shape in shaped.weighed]
    out = []
    for row in rows:
        shape = row["shape"]
        first = shape.replicas[0].chosen
        what = first.headline.split(", context ")[0].split(" ", 1)[-1] if first.engine == "vllm" else "llama.cpp"
        out.append(
            {
                "kind": row["kind"],
                "engines": shape.count,
                "what": f"{first.engine} {what}",
                "nodes": "+".join(sorted({r.node or "head" for r in shape.replicas} | set(first.nodes))),
                "context": shape.context,
                "warm": shape.warm,
                "decode": shape.decode,
                "why": shaped.why if row["kind"] == "chosen" else "",
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--markdown", action="store_true", help="one table for the README")
    args = parser.parse_args()
    from gateway.core.process import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        os.environ |= {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": home, "HF_TOKEN": "hf_test"}
        from tests.integration.tools.local_hub import running

        with running(port=port):
            if args.markdown:
                print("| rig | model | sessions | shape | engines | context | warm at 32k | decode tok/s |")
                print("|---|---|---|---|---|---|---|---|")
            for rig, model, gpus, remote, sessions in CASES:
                found = shapes(model, gpus, remote, sessions)
                if not args.markdown:
                    print(f"\n{rig}: {model}, --sessions {sessions}")
                for s in found:
                    mark = "**" if s["kind"] == "chosen" else ""
                    if args.markdown:
                        print(
                            f"| {rig} | {model.split('/')[-1]} | {sessions} | {mark}{s['kind']}{mark} | "
                            f"{s['engines']} × {s['what']} ({s['nodes']}) | {s['context']:,} | {s['warm']} | "
                            f"{s['decode']:,.0f} |"
                        )
                    else:
                        print(
                            f"  {s['kind']:8} {s['engines']} × {s['what']} on {s['nodes']}: context {s['context']:,}, "
                            f"{s['warm']} warm, ~{s['decode']:,.0f} tokens/s"
                        )
                        if s["why"]:
                            print(f"           why: {s['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
