"""`gateway plan --json` for every family of the plan table on every machine (and a few pinned cases), written
to a folder or compared with one: the check that a refactor changed no plan (issue 43: 83 cases, identical).

    .venv/bin/python benchmarks/plan_snapshot.py --write /tmp/before      # on the tree before (~2-4 min)
    .venv/bin/python benchmarks/plan_snapshot.py --compare /tmp/before    # on the tree after: "0 of 83 differ"

Each case runs the CLI in a child process from the current directory's tree, against the local test hub
(a NAMED stand-in for huggingface.co, as in plan_table.py). Run both sides in the same environment: which
engines are installed is part of a plan.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.getcwd())
from benchmarks.plan_table import FAMILIES, MACHINES, RAM

PINNED: list[tuple[str, str, list[str]]] = [
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "1x80@9.0", ["--vllm-version", "0.24.0"]),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "1x80@9.0", ["--vllm-version", "0.18.0"]),
    ("Qwen/Qwen3-8B", "2x24@8.9", ["--sessions", "16"]),
    ("Qwen/Qwen3-8B", "2x16@8.9", ["--engine", "llamacpp", "--llama-launcher", "python"]),
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "2x24@8.9", ["--engine", "llamacpp"]),
]


def cases() -> Iterator[tuple[str, str, list[str]]]:
    for model in FAMILIES:
        for machine in MACHINES:
            yield model, machine, []
    yield from PINNED


def plan(model: str, machine: str, extra: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The CLI's exit status and JSON for one case (this tree's code: the child imports from the cwd)."""
    argv = [sys.executable, "-c", "from gateway.cli.commands import main; main()", "plan", "--json"]
    argv += ["--model", model, "--ram", RAM] + (["--gpus", spec] if (spec := MACHINES[machine]) else [])
    argv += [] if "--llama-launcher" in extra else ["--llama-launcher", "native"]
    argv += [] if "--vllm-version" in extra else ["--vllm-version", "0.32.0"]
    done = subprocess.run(argv + extra, capture_output=True, text=True, env=env, cwd=os.getcwd())
    return {"rc": done.returncode, "stdout": done.stdout, "stderr_tail": done.stderr.splitlines()[-3:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    side = parser.add_mutually_exclusive_group(required=True)
    side.add_argument("--write", type=Path, help="a folder to write each case's result into")
    side.add_argument("--compare", type=Path, help="a folder written before: print and count what differs")
    args = parser.parse_args()
    from gateway.core.process import free_port

    port = free_port()
    differ = total = 0
    with tempfile.TemporaryDirectory() as home:
        env = os.environ | {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": home, "HF_TOKEN": "hf_test"}
        os.environ.update(env)  # huggingface_hub reads these once, at import
        from tests.integration.tools.local_hub import running

        with running(port=port):
            for total, (model, machine, extra) in enumerate(cases(), start=1):
                name = f"{total - 1:03d}-{model.replace('/', '_')}-{machine}.json"
                got = plan(model, machine, extra, env)
                if args.write:
                    args.write.mkdir(parents=True, exist_ok=True)
                    (args.write / name).write_text(json.dumps(got, indent=1))
                    print(name, "exit", got["rc"], file=sys.stderr)
                    continue
                want = json.loads((args.compare / name).read_text())
                same = (want["rc"], want["stdout"]) == (got["rc"], got["stdout"])
                differ += not same
                print(name, "same" if same else "DIFFERENT", file=sys.stderr)
    if args.compare:
        print(f"{differ} of {total} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
