"""Planned against real GPU memory for llama.cpp, on a real GPU: `gateway plan` reads the GPUs from NVML,
`gateway serve` starts llama-server (a CUDA build) with that plan, and the gateway's own /metrics then
says, per GPU and term, what the plan expected and what llama-server logged it allocated, beside what
NVML sees the engine process hold.

    python benchmarks/gpu_llamacpp_memory.py --llama-server BUILD/bin/llama-server \
        --tokenizer llama.cpp/models/ggml-vocab-llama-bpe.gguf --out DIR [--models llama-3-8b,llama-3-70b]

The models are shape-true Llama 3 8B and 70B in llama.cpp's Q4_K_M mix with zero weights (a sparse file:
nothing on disk, the buffers the real model's; the answers are noise). One JSON per model goes to DIR.
Needs a machine with an NVIDIA GPU and a CUDA llama-server (llama.cpp built with -DGGML_CUDA=ON);
README "Memory on a real GPU" has the figures and the build line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.core.process import free_port
from tests.synthetic_gguf import LLAMA_8B, LLAMA_70B, make_llama_shapes
from tests.waiting import answers, exited, wait_until

SHAPES = {"llama-3-8b": LLAMA_8B, "llama-3-70b": LLAMA_70B}
MiB = 2**20


def nvml_used() -> list[int]:
    """Bytes in use per GPU, NVML's view (the driver's own reservation included)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []  # no driver: a dry run of the steps on a CPU machine
    try:
        return [
            int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used)
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


def metric_rows(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each sample of ``name`` in a Prometheus text page."""
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def gateway(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", *args]


def measure(name: str, model: Path, llama_server: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, "GATEWAY_LLAMA_SERVER_COMMAND": json.dumps([llama_server])}
    before = nvml_used()
    planned = subprocess.run(gateway("plan", "--model", str(model), "--json"), env=env, capture_output=True, text=True)
    plan = json.loads(planned.stdout) if planned.returncode in (0, 2) and planned.stdout else {}
    port = free_port()
    log_path = out / f"{name}-serve.log"
    started = time.monotonic()
    with log_path.open("wb") as sink:
        serve = subprocess.Popen(
            gateway("serve", "--model", str(model), "--port", str(port), "--state-dir", f"/tmp/gpumem-{name}"),
            env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    result: dict[str, Any] = {"model": name, "plan_exit": planned.returncode, "nvml_used_before": before}
    try:
        url = f"http://127.0.0.1:{port}"
        with contextlib.suppress(AssertionError):  # not ready in time, or exited: recorded below
            wait_until(
                lambda: answers(url + "/ready"), what="/ready", timeout_s=300, interval_s=0.5, abort=exited(serve)
            )
        result["ready_s"] = round(time.monotonic() - started, 1)
        result["serve_exit"] = serve.poll()
        if serve.poll() is None:
            served = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
            chat = httpx.post(
                url + "/v1/chat/completions",
                json={"model": served, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
                timeout=120,
            )
            result["chat_status"] = chat.status_code
            page = httpx.get(url + "/metrics", timeout=10).text
            result["planned_mib"] = {
                f"{row['gpu']}/{row['term']}": round(value / MiB, 1)
                for row, value in metric_rows(page, "gateway_plan_gpu_memory_bytes")
            }
            result["engine_logged_mib"] = {
                f"{row['device']}/{row['term']}": round(value / MiB, 1)
                for row, value in metric_rows(page, "gateway_engine_memory_bytes")
            }
            result["nvml_used_serving"] = nvml_used()
            result["status_backend"] = httpx.get(url + "/status", timeout=10).json().get("backend")
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
        engine_pid = (result.get("status_backend") or {}).get("pid")
        result["engine_left_running"] = bool(engine_pid) and Path(f"/proc/{engine_pid}").exists()
    decision = plan.get("decision", {})
    chosen = (plan.get("candidates") or [{}])[decision.get("candidate", 0) or 0] if plan else {}
    result["plan_reason"] = decision.get("reason")
    result["plan_memory_mib"] = chosen.get("memory_mib")
    result["plan_argv"] = chosen.get("argv")
    result["inventory"] = plan.get("inventory")
    if "nvml_used_serving" in result:
        used = [after - was for after, was in zip(result["nvml_used_serving"], before, strict=True)]
        result["nvml_engine_mib"] = [round(value / MiB, 1) for value in used]
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True, help="a CUDA build of llama-server")
    parser.add_argument("--tokenizer", type=Path, required=True, help="llama.cpp's models/ggml-vocab-llama-bpe.gguf")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="llama-3-8b,llama-3-70b")
    parser.add_argument("--files", type=Path, default=Path("/tmp/gpu-memory-models"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.files.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        model = make_llama_shapes(args.files / f"{name}-q4_k_m-zeros.gguf", SHAPES[name], name, args.tokenizer)
        row = measure(name, model, args.llama_server, args.out)
        print(json.dumps({k: row.get(k) for k in ("model", "ready_s", "chat_status", "plan_reason", "planned_mib",
                                                   "engine_logged_mib", "nvml_engine_mib", "engine_left_running")}),
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
