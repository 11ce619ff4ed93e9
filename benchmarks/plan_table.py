"""The plan's decision for each model family on each machine, one row each: what `gateway plan`
decides (engine, checkpoint or GGUF quantization, TP or GPUs split over, context, KV type,
utilization, sequences, estimated tokens/s) and what the decision gives up.

The families are the local test hub's (tests/data/hub, real configs and GGUF header shapes; a NAMED
stand-in for huggingface.co, started here in a thread) and the catalog's GLM-4.7-Flash; the machines
are simulated (`--gpus` specs) with 64 GiB of RAM. Nothing is downloaded and no engine is started.

    .venv/bin/python benchmarks/plan_table.py                 # every family on every machine (~1 min)
    .venv/bin/python benchmarks/plan_table.py --model glm-4.7-flash --machine 2x32@12.0
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MACHINES = {
    "2x16@8.9": "2x16GiB@8.9",
    "2x24@8.6": "2x24GiB@8.6",
    "2x24@8.9": "2x24GiB@8.9",
    "2x32@12.0": "2x32GiB@12.0",
    "1x80@9.0": "1x80GiB@9.0",
    "cpu": None,
}
FAMILIES = (
    "glm-4.7-flash",
    "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "Qwen/Qwen3-8B",
    "openai/gpt-oss-20b",
    "meta-llama/Llama-3.1-8B-Instruct",
    "mistralai/Devstral-Small-2507",
    "zai-org/GLM-4.5-Air",
    "google/gemma-3-27b-it",
    "google/gemma-4-31B-it",
    "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "ibm-granite/granite-4.0-h-small",
    "deepseek-ai/DeepSeek-V3.1",
    "moonshotai/Kimi-K2-Instruct",
)
RAM = "64GiB"


def plan_json(model: str, machine: str, **settings: Any) -> dict[str, Any]:
    """`gateway plan --json` for the model on the simulated machine (the local hub answers)."""
    from gateway.cli.full_settings import Settings
    from gateway.core.devices import Inventory, inventory, parse_size
    from gateway.planning.catalog import builtin_catalog
    from gateway.planning.from_settings import plan_for
    from gateway.planning.plan_report import to_json

    spec = MACHINES[machine]
    if spec is None:
        ram = parse_size(RAM)
        inv = Inventory((), ram, ram, source="simulated")
    else:
        inv = inventory(spec, RAM)
    values = {"model": model, "llama_launcher": "native", "vllm_version": "0.32.0", **settings}
    entry = builtin_catalog().resolve(model)
    return to_json(plan_for(Settings(**values), entry, inv, serving=False), 8000)


def row(data: dict[str, Any]) -> dict[str, Any]:
    """The decision's figures, engine-neutral names."""
    decision = data["decision"]
    if decision["candidate"] is None:
        return {"engine": "none", "loads": "", "where": "", "context": 0, "kv": "", "util": "", "seqs": ""}
    c = data["candidates"][decision["candidate"]]
    speed = c.get("tokens_per_s_estimate")
    out: dict[str, Any] = {"context": c["context_length"], "tok/s": f"{speed:,.0f}" if speed else "-"}
    if decision["backend"] == "vllm":
        quant = c.get("quantization") or "bf16"
        out |= {
            "engine": "vllm",
            "loads": f"{c['checkpoint'].split('/')[-1]} ({quant})",
            "where": f"TP{c['tensor_parallel_size']}" + (" eager" if c["enforce_eager"] else ""),
            "kv": c["kv_cache_dtype"],
            "util": c["gpu_memory_utilization"],
            "seqs": c["max_num_seqs"],
        }
        if c.get("cpu_offload_gb"):
            out["where"] += f" offload {c['cpu_offload_gb']:g} GB"
    else:
        split = [share for share in c["tensor_split"] if share > 0]
        gpus = len(split) or (1 if c["n_gpu_layers"] else 0)
        where = f"{gpus} GPU" if gpus else "CPU"
        if c["n_cpu_moe"]:
            where += f", {c['n_cpu_moe']} blocks' experts in RAM"
        elif gpus and c["memory_mib"]["host"]["model"] > 2048:
            where += ", layers in RAM"
        out |= {
            "engine": "llamacpp",
            "loads": (c.get("gguf_variant") or {}).get("quant", c["checkpoint"].split("/")[-1]),
            "where": where,
            "kv": c["kv_type"],
            "util": "",
            "seqs": "",
        }
    return out


COLUMNS = ("model", "machine", "engine", "loads", "where", "context", "kv", "util", "seqs", "tok/s")


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [f"{r.get(c, ''):,}" if isinstance(r.get(c), int) else str(r.get(c, "")) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", action="append", help="a family (repeatable; default: all)")
    parser.add_argument("--machine", action="append", choices=sorted(MACHINES), help="(repeatable; default: all)")
    args = parser.parse_args()
    from gateway.core.process import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        # huggingface_hub reads these once, at import: set before anything imports it
        os.environ |= {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": home, "HF_TOKEN": "hf_test"}
        from tests.integration.tools.local_hub import running

        with running(port=port):
            rows = table(args.model or FAMILIES, args.machine or list(MACHINES))
    print()
    print(markdown(rows))


def table(models: list[str], machines: list[str]) -> list[dict[str, Any]]:
    """Each model on each machine, a row printed to stderr as it is planned."""
    rows = []
    for model in models:
        for machine in machines:
            short = model.split("/")[-1]
            rows.append({"model": short, "machine": machine} | row(plan_json(model, machine)))
            print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    main()
