"""llama.cpp placement: layers pooled across GPUs by usable memory, the rest in RAM, KV exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.backends import llamacpp
from gateway.backends.llamacpp import estimate_gguf_facts, facts_from_gguf
from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.gguf_reader import read_gguf_header
from gateway.backends.llamacpp.kv_cache import is_sliding, kv_bytes_per_token_layer
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON
from gateway.backends.model_facts import facts_from_config
from gateway.core.devices import GIB, MIB, Inventory, parse_gpu_spec
from gateway.core.policy import Policy
from gateway.planning.planner import EnginePlan, evaluate_and_choose
from tests.extras import needs_embedded_model
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
LLAMA_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def _llama70b_engines() -> list[EnginePlan]:
    from gateway.backends import vllm
    from gateway.backends.vllm.checkpoint_facts import checkpoint_facts

    facts = checkpoint_facts(LLAMA_70B, "meta-llama/Llama-3.1-70B-Instruct")

    return engine_plans(
        "llama-3.1-70b",
        checkpoints=[vllm.Checkpoint("meta-llama/Llama-3.1-70B-Instruct", facts)],
        gguf_facts=estimate_gguf_facts(facts, LLAMA_70B, 16.0),
        gguf="Llama-3.1-70B-Instruct-BF16.gguf",
    )


def _machine(spec: str, ram_gib: int) -> Inventory:
    return Inventory(parse_gpu_spec(spec), ram_gib * GIB, ram_gib * GIB, source="simulated")


def test_70b_bf16_on_two_24gib_cards_goes_to_llamacpp_split_across_both_with_the_rest_in_ram() -> None:
    plan = evaluate_and_choose("llama-3.1-70b", _llama70b_engines(), _machine("2x24GiB", 256), Policy())
    assert not any(c.fits for c in plan.candidates_of("vllm"))
    assert any("exceed the" in c.reason for c in plan.candidates_of("vllm"))
    chosen = plan.chosen
    assert plan.decision_backend == "llamacpp" and isinstance(chosen, llamacpp.LlamaCppCandidate)
    p = chosen.placement
    assert 0 < p.n_gpu_layers < 81  # some layers on the GPUs, the rest in RAM
    assert p.tensor_split[0] / sum(p.tensor_split) == pytest.approx(0.5, abs=0.05)  # equal cards: even, to a layer
    assert all(model > 15 * GIB for model in p.device_model)  # both cards carry layers
    assert not p.overflow()
    assert p.host_model > 90 * GIB  # most of the 131 GiB of BF16 weights stay in RAM
    assert chosen.n_ctx >= 32768
    argv = chosen.argv
    assert argv[argv.index("--n_gpu_layers") + 1] == str(p.n_gpu_layers)
    split = argv[argv.index("--tensor_split") + 1 : argv.index("--tensor_split") + 3]
    assert [float(s) for s in split] == list(p.tensor_split)
    assert argv[argv.index("--flash_attn") + 1] == "True"


def test_70b_bf16_with_too_little_ram_fits_nowhere_and_says_so() -> None:
    plan = evaluate_and_choose("llama-3.1-70b", _llama70b_engines(), _machine("2x24GiB", 32), Policy())
    assert plan.chosen is None and plan.decision_backend is None
    assert all("GiB of RAM" in c.reason for c in plan.candidates_of("llamacpp"))
    assert plan.decision_reason.startswith("nothing fits")


def test_unequal_gpus_split_by_usable_memory_not_evenly() -> None:
    facts = estimate_gguf_facts(facts_from_config(LLAMA_70B, "70b"), LLAMA_70B, 4.85)
    gpus = parse_gpu_spec("1x12GiB,1x24GiB")
    placement, _ = llamacpp.best_placement(llamacpp.PlacementQuery(facts, gpus, 32768, "f16", PYTHON))
    weight = [u - c for u, c in zip(placement.device_usable, placement.device_compute, strict=True)]
    expected = weight[0] / sum(weight)
    assert placement.tensor_split[0] / sum(placement.tensor_split) == pytest.approx(expected, abs=0.02)  # to a layer
    assert placement.device_model[1] > 1.8 * placement.device_model[0]


def test_moe_experts_go_to_ram_first_with_the_native_server() -> None:
    config = json.loads((CONFIGS / "Qwen3-30B-A3B.json").read_text())
    config.setdefault("vocab_size", 151936)
    facts = estimate_gguf_facts(facts_from_config(config, "qwen3-30b-a3b"), config, 16.0)  # F16: ~57 GiB
    gpus = parse_gpu_spec("1x24GiB")
    native, how = llamacpp.best_placement(llamacpp.PlacementQuery(facts, gpus, 32768, "f16", NATIVE))
    assert native.n_cpu_moe > 0 and native.n_gpu_layers == facts.num_layers + 1, how
    python, how = llamacpp.best_placement(llamacpp.PlacementQuery(facts, gpus, 32768, "f16", PYTHON))
    assert python.n_cpu_moe == 0 and python.n_gpu_layers < facts.num_layers, how


def test_experts_moved_to_ram_move_their_routed_share_of_the_reads_there() -> None:
    """Decode reads a block's shared part and its routed experts' share: moving experts to RAM takes
    exactly that share off the GPU and puts it on the host, so the GPU never reads less than the
    blocks' non-expert part and more experts in RAM is never faster."""
    from gateway.backends.llamacpp import speed

    config = json.loads((CONFIGS / "Qwen3-30B-A3B.json").read_text())
    config.setdefault("vocab_size", 151936)
    facts = estimate_gguf_facts(facts_from_config(config, "qwen3-30b-a3b"), config, 16.0)
    gpus = parse_gpu_spec("1x80GiB@9.0")
    routed = facts.experts_per_token / facts.num_experts
    whole = llamacpp.place(llamacpp.PlacementQuery(facts, gpus, 32768, "f16", NATIVE), facts.num_layers + 1)
    base_gpu, base_host = speed.bytes_read_per_token(facts, whole, "f16", 32768, 1)
    previous = speed.tokens_per_second(facts, whole, gpus, "f16", 32768)
    for n_cpu_moe in (8, 24, facts.num_layers):
        moved = llamacpp.place(
            llamacpp.PlacementQuery(facts, gpus, 32768, "f16", NATIVE), facts.num_layers + 1, n_cpu_moe
        )
        gpu_bytes, host_bytes = speed.bytes_read_per_token(facts, moved, "f16", 32768, 1)
        share = sum(facts.expert_layer_bytes[:n_cpu_moe]) * routed
        assert host_bytes - base_host == pytest.approx(share)
        assert base_gpu[0] - gpu_bytes[0] == pytest.approx(share)
        now = speed.tokens_per_second(facts, moved, gpus, "f16", 32768)
        assert 0 < now < previous
        previous = now


def _gqa_facts(layers: int, kv_heads: int, head: int) -> GgufFacts:
    config = {
        "hidden_size": 4096,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": kv_heads,
    }
    config["head_dim"] = head
    return GgufFacts.from_config(facts_from_config(config, "gqa"), config)


@pytest.mark.parametrize(
    ("layers", "kv_heads", "n_ctx", "reported_mib"),
    [
        (48, 4, 4096, 384),  # llama-01: Qwen3-30B-A3B F16 at -c 4096
        (28, 8, 40960, 4480),  # llama-03: qwen3-1.7b at its training context
    ],
)
def test_kv_cache_matches_llamacpp_logs_exactly(layers: int, kv_heads: int, n_ctx: int, reported_mib: int) -> None:
    facts = _gqa_facts(layers, kv_heads, 128)
    total = sum(llamacpp.kv_layer_bytes(facts, i, "f16", n_ctx, NATIVE) for i in range(layers))
    assert total == reported_mib * MIB


def test_q8_0_kv_is_34_bytes_per_32_elements() -> None:
    facts = _gqa_facts(1, 8, 128)
    assert llamacpp.kv_layer_bytes(facts, 0, "q8_0", 32, PYTHON) == 32 * 2 * 8 * 128 * 34 // 32


@pytest.fixture(scope="module")
def gemma_facts() -> GgufFacts:
    from tests.extras import embedded_model

    return facts_from_gguf(read_gguf_header(embedded_model()), "gemma-3-270m")


@needs_embedded_model
def test_gguf_facts_of_the_real_gemma_file(gemma_facts: GgufFacts) -> None:
    assert (gemma_facts.num_layers, gemma_facts.num_kv_heads, gemma_facts.head_dim) == (18, 1, 256)
    assert gemma_facts.max_position == 32768 and gemma_facts.sliding_window == 512
    total = sum(gemma_facts.layer_bytes) + gemma_facts.embedding_bytes
    assert abs(total - gemma_facts.weight_bytes) < 4096  # every tensor is counted once (output is tied)
    assert 0 <= gemma_facts.output_bytes - gemma_facts.embedding_bytes < 64 * 1024  # tied: output = embedding + norm


@needs_embedded_model
def test_compute_buffer_matches_the_logged_514_mib_for_gemma_at_32k(gemma_facts: GgufFacts) -> None:
    estimate = llamacpp.compute_buffer_bytes(
        gemma_facts, 32768, flash_attention=False, holds_output=True, launcher=llamacpp.PYTHON
    )
    assert abs(estimate / MIB - 514.5) / 514.5 < 0.05


@needs_embedded_model
def test_cpu_plan_for_the_embedded_default(gemma_facts: GgufFacts) -> None:
    engines = engine_plans("gemma-3-270m", gguf_facts=gemma_facts, gguf="gemma.gguf", chat_format="gemma")
    plan = evaluate_and_choose("gemma-3-270m", engines, Inventory((), 24 * GIB, 20 * GIB, source="none"), Policy())
    chosen = plan.chosen
    assert isinstance(chosen, llamacpp.LlamaCppCandidate)
    assert chosen.placement.n_gpu_layers == 0 and chosen.n_ctx == 32768
    # f16 KV: q8_0 buys no context here and costs prefill (test_plan_objective's measured figures)
    assert chosen.kv_type == "f16"
    assert "--chat_format" in chosen.argv


@pytest.fixture(scope="module")
def shape_ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GgufFacts]:
    """Gemma 4 31B and Llama 3 70B in Q4_K_M, header and tensor table only (sparse files, no disk)."""
    from tests.synthetic_gguf import make_gemma4_31b_shapes, make_llama_70b_shapes

    folder = tmp_path_factory.mktemp("shapes")
    return {
        "gemma4": facts_from_gguf(read_gguf_header(make_gemma4_31b_shapes(folder / "g4.gguf")), "gemma-4-31b"),
        "llama70b": facts_from_gguf(read_gguf_header(make_llama_70b_shapes(folder / "l70.gguf")), "llama-70b"),
    }


def test_gemma4_gguf_per_layer_kv_heads_and_sliding_pattern(shape_ggufs: dict[str, GgufFacts]) -> None:
    """convert_hf_to_gguf.py writes Gemma 4's head_count_kv and sliding_window_pattern as per-layer
    arrays; read as scalars they fell back to 32 KV heads on every layer, all 60 sliding."""
    facts = shape_ggufs["gemma4"]
    assert facts.sliding_layers == 50 and facts.sliding_window == 1024
    assert [is_sliding(facts, layer) for layer in range(6)] == [True] * 5 + [False]
    assert facts.kv_heads_per_layer[:6] == (16, 16, 16, 16, 16, 4)
    sliding, full = (kv_bytes_per_token_layer(facts, "f16", layer) for layer in (0, 5))
    assert sliding == 16 * (256 + 256) * 2 and full == 4 * (512 + 512) * 2


def test_gemma4_on_two_16gb_cards_places_all_61_layers(shape_ggufs: dict[str, GgufFacts]) -> None:
    """Issue 15 (6): read as 32 KV heads × 512 on every layer, all sliding, the cache left room for 21
    of 61 slots with llama-cpp-python (32k, q8_0; 16 with the CUDA copies) and 51 natively (32k, f16)."""
    from dataclasses import replace

    facts = shape_ggufs["gemma4"]
    gpus = parse_gpu_spec("2x16GiB")
    found = llamacpp.candidates(facts, "g4.gguf", gpus, 64 * GIB, min_context=32768, max_context=None, launcher=NATIVE)
    chosen = llamacpp.best(found)
    assert chosen is not None and chosen.placement.n_gpu_layers == 61 and not chosen.placement.overflow()
    assert chosen.n_ctx == 131072 and chosen.kv_type == "q8_0"
    uniform = replace(
        facts, kv_heads_per_layer=(), sliding_per_layer=(), sliding_layers=60, num_kv_heads=32, cache_key_dim_sliding=0
    )  # the old reading
    layers = {
        (launcher.name, name): llamacpp.best_placement(llamacpp.PlacementQuery(f, gpus, 32768, kv, launcher))[
            0
        ].n_gpu_layers
        for launcher, kv in ((NATIVE, "f16"), (PYTHON, "q8_0"))
        for name, f in (("old", uniform), ("new", facts))
    }
    assert layers == {("native", "old"): 51, ("native", "new"): 61, ("python", "old"): 16, ("python", "new"): 53}
    # llama-cpp-python keeps a full-size cache for the 50 sliding layers (13 GiB at 32k q8_0): not all fit
    # (53 and 16, not 55 and 21: CUDA's flash attention takes f16 copies of a layer's K and V,
    # test_llamacpp_cuda_compute)


def test_70b_q4_k_m_on_two_24gb_cards_keeps_every_layer_on_the_gpus(shape_ggufs: dict[str, GgufFacts]) -> None:
    """Issue 15 (10): the ladder used to take 131k context with 46 of 81 layers on the GPUs and 35 GiB
    in RAM (~1.7 tokens/s) over every layer on the GPUs at 32k with q8_0 KV (~15 tokens/s)."""
    facts = shape_ggufs["llama70b"]
    found = llamacpp.candidates(
        facts, "l70.gguf", parse_gpu_spec("2x24GiB"), 128 * GIB, min_context=32768, max_context=None, launcher=NATIVE
    )
    longest = found[0]
    # 45 layers, not 46, with CUDA's f16 copies of a layer's K and V (test_llamacpp_cuda_compute)
    assert (longest.n_ctx, longest.kv_type, longest.placement.n_gpu_layers) == (131072, "f16", 45) and longest.fits
    assert longest.placement.host_total > 34 * GIB
    chosen = llamacpp.best(found)
    assert chosen is not None and chosen.placement.n_gpu_layers == 81
    assert (chosen.n_ctx, chosen.kv_type) == (32768, "q8_0")
    assert chosen.tokens_per_s > 5 * longest.tokens_per_s
    assert 10 < chosen.tokens_per_s < 25  # 2 × 1008 GB/s (cc 8.9) at 70 % over ~42 GB
    assert "tokens/s" in chosen.reason and chosen.to_json()["tokens_per_s_estimate"] == round(chosen.tokens_per_s, 1)


def test_a_pinned_context_is_kept_even_with_layers_in_ram(shape_ggufs: dict[str, GgufFacts]) -> None:
    """The user asked for more context: the speed rule does not take it away."""
    facts = shape_ggufs["llama70b"]
    found = llamacpp.candidates(
        facts, "l70.gguf", parse_gpu_spec("2x24GiB"), 128 * GIB, min_context=131072, max_context=None,
        launcher=NATIVE, pinned_context_length=131072,
    )  # fmt: skip
    chosen = llamacpp.best(found)
    assert chosen is not None and chosen.n_ctx == 131072 and chosen.placement.n_gpu_layers < 81
    assert chosen.kv_type == "q8_0"  # the faster of the two: more layers on the GPUs


def test_speed_uses_the_gpu_family_bandwidth_and_ram_for_layers_in_ram(shape_ggufs: dict[str, GgufFacts]) -> None:
    from gateway.backends import bandwidth
    from gateway.backends.llamacpp import speed
    from gateway.core.devices import Device

    h100 = Device(0, "NVIDIA H100 80GB HBM3", 80 * GIB, 80 * GIB, (9, 0))
    assert bandwidth.gpu_bandwidth(h100) == 3350e9
    assert bandwidth.gpu_bandwidth(Device(0, "NVIDIA GeForce RTX 4070 Ti SUPER", GIB, GIB, (8, 9))) == 504e9
    assert bandwidth.gpu_bandwidth(parse_gpu_spec("1x32GiB@12.0")[0]) == 1792e9  # simulated: by capability
    assert bandwidth.gpu_bandwidth(parse_gpu_spec("1x32GiB@6.1")[0]) == bandwidth.DEFAULT_GPU_BANDWIDTH_GBPS * 1e9
    facts = shape_ggufs["llama70b"]
    on_h100 = llamacpp.place(llamacpp.PlacementQuery(facts, (h100,), 32768, "f16", NATIVE), 81)
    gpu_bytes, host_bytes = speed.bytes_read_per_token(facts, on_h100, "f16", 32768, 1)
    assert host_bytes == 0 and gpu_bytes[0] == pytest.approx(sum(facts.layer_bytes) + facts.output_bytes, rel=0.3)
    fast = speed.tokens_per_second(facts, on_h100, (h100,), "f16", 32768)
    half = speed.tokens_per_second(
        facts, llamacpp.place(llamacpp.PlacementQuery(facts, (h100,), 32768, "f16", NATIVE), 41), (h100,), "f16", 32768
    )
    assert fast > 35 and half < fast / 10  # 40 of 80 blocks from RAM at 60 GB/s dominate


def test_an_estimated_gemma4_gguf_has_the_same_per_layer_kv_as_the_file(shape_ggufs: dict[str, GgufFacts]) -> None:
    """A GGUF not downloaded yet is estimated from config.json the way convert_hf_to_gguf.py writes it."""
    config = {
        "model_type": "gemma4_text", "hidden_size": 5376, "num_hidden_layers": 60, "num_attention_heads": 32,
        "num_key_value_heads": 16, "num_global_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
        "intermediate_size": 21504, "vocab_size": 262144, "sliding_window": 1024, "tie_word_embeddings": True,
        "max_position_embeddings": 262144, "num_kv_shared_layers": 0,
        "layer_types": ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(60)],
    }  # fmt: skip
    estimated = estimate_gguf_facts(facts_from_config(config, "gemma-4-31b"), config, 4.85)
    read = shape_ggufs["gemma4"]
    per_layer = [kv_bytes_per_token_layer(estimated, "q8_0", layer) for layer in range(60)]
    assert per_layer == [kv_bytes_per_token_layer(read, "q8_0", layer) for layer in range(60)]
    assert estimated.weight_bytes == pytest.approx(read.weight_bytes, rel=0.1)


@pytest.mark.parametrize(("n_ctx", "kv_type"), [(131072, "q8_0"), (65536, "q8_0")])
def test_moe_split_search_keeps_the_fewest_experts_in_ram_that_any_split_fits(n_ctx: int, kv_type: str) -> None:
    """Qwen3-Coder-30B BF16 on 2×24 GB: the search used to fill GPU0 to the brim without the weights
    op offload copies onto it, so place() rejected its split and the search went on to more experts in
    RAM (21 at 131k q8_0, GPU1 two-thirds empty). Every split of whole slots is tried here: the plan's
    n_cpu_moe is the smallest for which one fits, and its split fits."""
    config = json.loads((CONFIGS.parent / "hub" / "configs" / "Qwen3-Coder-30B-A3B-Instruct.json").read_text())
    facts = estimate_gguf_facts(facts_from_config(config, "qwen3-coder"), config, 16.0)
    gpus = parse_gpu_spec("2x24GiB")
    slots = facts.num_layers + 1
    placement, how = llamacpp.best_placement(llamacpp.PlacementQuery(facts, gpus, n_ctx, kv_type, NATIVE))
    assert not placement.overflow() and placement.n_gpu_layers == slots, how

    def any_split_fits(moe: int) -> bool:
        splits = [(float(k), float(slots - k)) for k in range(slots + 1)]
        return any(
            not llamacpp.place(llamacpp.PlacementQuery(facts, gpus, n_ctx, kv_type, NATIVE), slots, moe, s).overflow()
            for s in splits
        )

    assert placement.n_cpu_moe > 0 and not any_split_fits(placement.n_cpu_moe - 1), how
    terms = zip(placement.device_model, placement.device_kv, placement.device_compute, strict=True)
    used = [sum(term) / GIB for term in terms]
    assert min(used) > 0.9 * max(used), used  # balanced: neither card left mostly empty


def test_a_python_plan_says_when_the_native_server_would_plan_more() -> None:
    """Gemma 4 31B (Q4_K_M) on 2×16 GB with llama-cpp-python: its 50 sliding-window layers keep
    caches of the whole context there, llama-server keeps each slot's 1,024-token window. The plan
    states the native server's context and speed in one note; a native plan has no such note."""
    config = json.loads((CONFIGS / "gemma-4-31B-it.json").read_text())
    facts = estimate_gguf_facts(facts_from_config(config, "gemma-4-31b"), config, 4.85)
    machine = _machine("2x16GiB@8.9", 64)
    python = evaluate_and_choose("gemma-4-31b", engine_plans("gemma-4-31b", gguf_facts=facts), machine, Policy())
    chosen = python.chosen
    assert isinstance(chosen, llamacpp.LlamaCppCandidate) and chosen.launcher is PYTHON
    notes = [n for n in python.notes if "the native llama-server would plan this GGUF" in n]
    assert len(notes) == 1, python.notes
    native = evaluate_and_choose(
        "gemma-4-31b", engine_plans("gemma-4-31b", gguf_facts=facts, launcher=NATIVE), machine, Policy()
    )
    best = native.chosen
    assert isinstance(best, llamacpp.LlamaCppCandidate) and best.launcher is NATIVE
    assert best.n_ctx > chosen.n_ctx or best.tokens_per_s > 1.25 * chosen.tokens_per_s
    assert f"context {best.n_ctx:,} KV {best.kv_type}, ~{best.tokens_per_s:,.0f} tokens/s" in notes[0]
    assert "sliding-window caches" in notes[0]
    assert not any("the native llama-server would plan" in n for n in native.notes)
