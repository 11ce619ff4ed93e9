"""Speculative decoding without a second model, measured: the default model on the native llama-server
with `--llama-draft off` and `--llama-draft ngram` (ngram-mod), on two kinds of answer an agent asks
for: free prose, and a file repeated back with a change (what an agent's edit or rewrite produces).

    .venv/bin/python benchmarks/draft_speed.py [--requests N] [--max-tokens N] [--threads N] [--json FILE]

Each case is `gateway serve --replan` with a fresh state directory; the figures are the engine's own
(its timings on each answer: decode tokens/s; its "draft acceptance" line: accepted/drafted), medians
over the requests, greedy so both runs produce the same tokens. MTP drafting needs a GGUF with an MTP
block (GLM-4.x, DeepSeek-V3, Qwen3-Next: tens of GB), which this machine cannot run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.rpc_vs_local import MODEL, free_port, process, wait_ok

CODE = "".join(f"def scale_{i}(values, factor):\n    return [v * factor + {i} for v in values]\n\n" for i in range(12))
PROMPTS = {
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "rewrite": f"Here is a file:\n\n{CODE}\nRepeat the whole file, renaming `factor` to `k` everywhere.",
}


def ask(url: str, prompt: str, requests: int, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    body["temperature"] = 0
    httpx.post(url + "/v1/chat/completions", json=body, timeout=600)  # warm-up
    decode, accepted, drafted = [], 0, 0
    for _ in range(requests):
        answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=600).json()
        timings = answer.get("timings", {})
        decode.append(float(timings.get("predicted_per_second", 0)))
        accepted += int(timings.get("draft_n_accepted", 0))
        drafted += int(timings.get("draft_n", 0))
    return {
        "decode_tokens_per_s": round(statistics.median(decode), 1),
        "drafted": drafted,
        "accepted": accepted,
    }


def case(workdir: Path, draft: str, requests: int, max_tokens: int, threads: int) -> dict[str, Any]:
    port = free_port()
    state = workdir / f"state-{draft}"
    log = workdir / f"{state.name}.log"
    argv = [
        sys.executable, "-m", "gateway", "serve", "--port", str(port), "--context-length", "4096",
        "--state-dir", str(state), "--replan", "--threads", str(threads), "--llama-draft", draft,
    ]  # fmt: skip
    with process(argv, log) as proc:
        wait_ok(f"http://127.0.0.1:{port}/ready", proc, log)
        url = f"http://127.0.0.1:{port}"
        results = {name: ask(url, prompt, requests, max_tokens) for name, prompt in PROMPTS.items()}
        measured = httpx.get(url + "/status", timeout=10).json()["speed"]["measured"]
    return {"draft": draft, "results": results, "acceptance_on_status": measured.get("draft_acceptance")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [case(Path(tmp), draft, args.requests, args.max_tokens, args.threads) for draft in ("off", "ngram")]
    off = cases[0]["results"]
    print(f"{'answer':8} {'draft':6} {'decode tok/s':>12} {'vs off':>7} {'accepted/drafted':>17}")
    for run in cases:
        for name, result in run["results"].items():
            ratio = result["decode_tokens_per_s"] / off[name]["decode_tokens_per_s"]
            share = f"{result['accepted']}/{result['drafted']}" if result["drafted"] else "-"
            print(f"{name:8} {run['draft']:6} {result['decode_tokens_per_s']:12.1f} {ratio:7.2f} {share:>17}")
    print(f"({time.monotonic() - started:.0f} s; acceptance on /status: {cases[1]['acceptance_on_status']})")
    if args.json:
        args.json.write_text(json.dumps(cases, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
