"""llama-server's room in the unified context, prompt cache in RAM and context checkpoints: set on purpose,
sized by the plan from the memory its own terms leave once the context is chosen, and counted in it (b11434
would otherwise take 8 GiB of RAM nobody planned, and with -c the context alone a session that other
agents' turns came between could not come back from the RAM cache)."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.backends import llamacpp
from gateway.backends.llamacpp import estimate_gguf_facts, warm_sessions
from gateway.backends.llamacpp.argv import LlamaCppConfig, build_launch, plan_argv
from gateway.backends.llamacpp.gguf_facts import GgufFacts, facts_from_gguf
from gateway.backends.llamacpp.gguf_reader import read_gguf_header
from gateway.backends.llamacpp.ladder import LlamaCppCandidate, candidates
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON
from gateway.backends.llamacpp.placement import GPU_MARGIN_BYTES, HOST_MARGIN_BYTES, place
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.backends.llamacpp.placement_search import best_placement
from gateway.backends.model_facts import facts_from_config
from gateway.core.devices import GIB, MIB, Inventory, parse_gpu_spec
from gateway.core.policy import Policy
from gateway.planning.planner import evaluate_and_choose
from tests.synthetic_gguf import PHI3_MINI, make_llama_shapes
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _facts(name: str) -> GgufFacts:
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    return estimate_gguf_facts(facts_from_config(config, name), config, 4.5)


def _plan(name: str, ram_gib: float, min_context: int = 8192) -> llamacpp.LlamaCppCandidate:
    inventory = Inventory(parse_gpu_spec("1x24GiB"), int(ram_gib * GIB), int(ram_gib * GIB), source="simulated")
    engines = engine_plans(name, gguf_facts=_facts(name), launcher=NATIVE)
    plan = evaluate_and_choose(name, engines, inventory, Policy(min_context=min_context))
    chosen = plan.chosen
    assert isinstance(chosen, llamacpp.LlamaCppCandidate)
    return chosen


def _flag(argv: list[str], name: str) -> int:
    return int(argv[argv.index(name) + 1])


def test_sizing_takes_checkpoints_first_then_half_of_the_rest_capped_at_four_kv_caches() -> None:
    plain = warm_sessions.size(10 * GIB, 1 * GIB, 0)
    assert (plain.cache_ram_bytes, plain.checkpoints) == (4 * GIB, 0)  # half would be 5 GiB: four KV caches cap it
    assert warm_sessions.size(10 * GIB, 8 * GIB, 0).cache_ram_bytes == 5 * GIB
    swa = warm_sessions.size(10 * GIB, 1 * GIB, 100 * MIB)
    assert swa.checkpoints == 8 and swa.host_bytes <= 10 * GIB
    assert swa.cache_ram_bytes == (10 * GIB - 8 * 4 * 100 * MIB) // 2 // MIB * MIB
    assert warm_sessions.size(300 * MIB, 1 * GIB, 0) == warm_sessions.WarmSessions()  # under 256 MiB: off
    # a small model's four prompts are kept however few MiB they take (off, its sessions evicted each
    # other from the unified 32k context and every interleaved turn prefilled its whole prompt)
    assert warm_sessions.size(10 * GIB, 16 * MIB, 0).cache_ram_bytes == 64 * MIB
    assert warm_sessions.size(-GIB, 1 * GIB, 100 * MIB).host_bytes == 0  # nothing spare: nothing kept


def test_only_layers_that_cannot_roll_back_need_checkpoints() -> None:
    assert warm_sessions.checkpoint_bytes(_facts("Llama-3.1-8B"), "f16") == 0  # full attention: the cache rolls back
    gpt_oss = _facts("gpt-oss-20b")  # every other layer slides over 128 tokens
    sliding = sum(1 for layer in range(gpt_oss.num_layers) if llamacpp.kv_cache.is_sliding(gpt_oss, layer))
    per_token = llamacpp.kv_cache.kv_bytes_per_token_layer(gpt_oss, "f16", 0)
    assert warm_sessions.checkpoint_bytes(gpt_oss, "f16") == sliding * int((128 + 512) * per_token)
    assert warm_sessions.checkpoint_bytes(_facts("Qwen3-Next-80B-A3B-Instruct"), "f16") > 0  # recurrent states


def test_the_plan_sizes_the_prompt_cache_from_free_ram_and_counts_it() -> None:
    roomy, tight = _plan("Llama-3.1-8B", 64), _plan("Llama-3.1-8B", 4)
    for chosen, ram in ((roomy, 64 * GIB), (tight, 4 * GIB)):
        warm = chosen.warm
        assert _flag(chosen.argv, "--cache-ram") == warm.cache_ram_bytes // MIB  # never llama-server's 8 GiB default
        assert chosen.placement.host_total + HOST_MARGIN_BYTES + warm.host_bytes <= ram  # within the RAM it saw
        assert chosen.to_json()["memory_mib"]["host"]["prompt_cache"] == round(warm.host_bytes / MIB, 1)
        assert _flag(chosen.argv, "--ctx-checkpoints") == 0  # full attention
        assert _flag(chosen.argv, "--cache-reuse") == 256 and "--slot-prompt-similarity" in chosen.argv
    kv = sum(roomy.placement.device_kv) + roomy.placement.host_kv
    spare = 64 * GIB - roomy.placement.host_total - HOST_MARGIN_BYTES
    assert roomy.warm.cache_ram_bytes == min(spare // 2, 4 * kv) // MIB * MIB and "prompt cache" in roomy.reason
    assert 0 < tight.warm.cache_ram_bytes < roomy.warm.cache_ram_bytes


def test_a_sliding_window_model_keeps_checkpoints_counted_in_ram() -> None:
    chosen = _plan("gpt-oss-20b", 64, min_context=4096)
    assert _flag(chosen.argv, "--ctx-checkpoints") == 8
    assert chosen.warm.host_bytes == chosen.warm.cache_ram_bytes + 4 * 8 * chosen.warm.checkpoint_bytes
    assert "checkpoints/slot" in chosen.reason


def test_llama_cpp_python_gets_none_of_it() -> None:
    facts = _facts("Llama-3.1-8B")
    found = candidates(facts, "m.gguf", (), 64 * GIB, min_context=8192, max_context=None, launcher=PYTHON)
    assert all(c.warm.host_bytes == 0 and "prompt cache" not in c.reason for c in found)


def _rung(found: list[LlamaCppCandidate], n_ctx: int, kv_type: str = "f16") -> LlamaCppCandidate:
    return next(c for c in found if c.n_ctx == n_ctx and c.kv_type == kv_type and not c.optional)


def test_the_unified_cache_has_room_for_three_more_contexts_where_memory_allows() -> None:
    """-c is four contexts and --kv-unified-per-slot one: Claude Code's 20k and Qwen Code's 18k both stay in
    the cache (with -c the context alone, Claude Code's interleaved turns re-prefilled 5 of 6 times)."""
    facts = _facts("Llama-3.1-8B")
    found = candidates(facts, "m.gguf", (), 64 * GIB, min_context=32768, max_context=32768, launcher=NATIVE)
    chosen = _rung(found, 32768)
    argv = plan_argv(chosen, served_name="m", gguf="m.gguf")
    assert (_flag(argv, "-c"), _flag(argv, "--kv-unified-per-slot")) == (4 * 32768, 32768)
    assert chosen.context_length == 32768 and chosen.kv_tokens == 4 * 32768  # advertised: one request's context
    context_only, _ = best_placement(PlacementQuery(facts, (), 32768, "f16", NATIVE))
    assert chosen.placement.host_kv == 4 * context_only.host_kv  # full attention: KV grows with the cells
    assert chosen.warm.room_cells == 3 * 32768 and chosen.warm.room_bytes == 3 * context_only.host_kv
    assert chosen.to_json()["kv_cells"] == 4 * 32768 and chosen.to_json()["memory_mib"]["host"]["kv"] == 4 * 4096
    assert "unified KV 131,072 cells: 98,304 beyond the context (3.0x)" in chosen.reason
    assert chosen.placement.host_total + HOST_MARGIN_BYTES + chosen.warm.host_bytes <= 64 * GIB
    # the prompt cache still holds four prompts of one context each (not of the room)
    assert chosen.warm.cache_ram_bytes == 4 * context_only.host_kv


def test_the_room_comes_from_what_the_gpu_leaves_after_the_longest_context() -> None:
    """An agent user wants the longest context first: the 131,072 rung keeps every layer on the 24 GiB card and
    gets the room the card has left, in eighths of the context, and not one eighth more."""
    facts, gpus = _facts("Llama-3.1-8B"), parse_gpu_spec("1x24GiB")
    found = candidates(facts, "m.gguf", gpus, 64 * GIB, min_context=8192, max_context=None, launcher=NATIVE)
    chosen = _rung(found, 131072)
    context_only, _ = best_placement(PlacementQuery(facts, gpus, 131072, "f16", NATIVE))
    p = chosen.placement
    assert (p.n_gpu_layers, p.n_cpu_moe) == (context_only.n_gpu_layers, context_only.n_cpu_moe) == (33, 0)
    room = chosen.warm.room_cells
    assert 0 < room < 3 * 131072 and room % (131072 // 8) == 0
    assert p == place(PlacementQuery(facts, gpus, 131072 + room, "f16", NATIVE), 33) and not p.overflow()
    assert place(PlacementQuery(facts, gpus, 131072 + room + 131072 // 8, "f16", NATIVE), 33).overflow()
    assert chosen.warm.room_bytes == sum(p.device_kv) - sum(context_only.device_kv) > 0
    for found_one in found:  # never a layer or an expert less for the room
        if found_one.fits:
            alone, _ = best_placement(
                PlacementQuery(facts, gpus, found_one.n_ctx, found_one.kv_type, NATIVE, found_one.draft)
            )
            assert (found_one.placement.n_gpu_layers, found_one.placement.n_cpu_moe) == (
                alone.n_gpu_layers,
                alone.n_cpu_moe,
            )


def test_a_card_the_context_just_fills_gets_no_room_and_keeps_the_context() -> None:
    facts = _facts("Llama-3.1-8B")
    context_only, _ = best_placement(PlacementQuery(facts, parse_gpu_spec("1x24GiB"), 131072, "f16", NATIVE))
    used = context_only.device_model[0] + context_only.device_kv[0] + context_only.device_compute[0]
    gpus = parse_gpu_spec(f"1x24GiB:free={(used + GPU_MARGIN_BYTES) // MIB + 1}MiB")
    found = candidates(facts, "m.gguf", gpus, 64 * GIB, min_context=131072, max_context=131072, launcher=NATIVE)
    chosen = _rung(found, 131072)
    assert chosen.fits and chosen.placement.n_gpu_layers == 33 and chosen.warm.room_cells == 0
    assert _flag(plan_argv(chosen, served_name="m", gguf="m.gguf"), "-c") == 131072
    assert "no room for sessions kept warm" in chosen.reason


def test_on_the_cpu_the_room_takes_at_most_half_the_spare_ram() -> None:
    """The other half stays for the checkpoints and the prompt cache."""
    facts = _facts("Llama-3.1-8B")
    context_only, _ = best_placement(PlacementQuery(facts, (), 32768, "f16", NATIVE))
    spare = 4 * GIB
    ram = context_only.host_total + HOST_MARGIN_BYTES + spare
    found = candidates(facts, "m.gguf", (), ram, min_context=32768, max_context=32768, launcher=NATIVE)
    chosen = _rung(found, 32768)
    grown = chosen.placement.host_total - context_only.host_total
    assert 0 < chosen.warm.room_cells < 3 * 32768 and chosen.warm.room_bytes <= grown <= spare // 2
    assert chosen.warm.cache_ram_bytes > 0
    assert chosen.placement.host_total + HOST_MARGIN_BYTES + chosen.warm.host_bytes <= ram


def test_llama_server_caps_each_request_at_the_advertised_context() -> None:
    """-c the context and its room, --kv-unified-per-slot the context the gateway advertises: b11434 caps each
    slot there (server-context.cpp n_ctx_slot) and refuses a longer prompt with its own "exceeds the available
    context size (N tokens)", which the gateway rewords per dialect; without the cap one request could take
    all four contexts."""
    room = warm_sessions.WarmSessions(64 * MIB, room_cells=3 * 8192)
    config = LlamaCppConfig(Path("/m.gguf"), "m", 8192, launcher=NATIVE, warm=room)
    launch = build_launch(config, port=1, api_key="k", command=["llama-server"])
    assert (_flag(launch.argv, "-c"), _flag(launch.argv, "--kv-unified-per-slot")) == (4 * 8192, 8192)
    assert launch.context_length == 8192  # what /v1/models and the overflow errors say
    by_hand = build_launch(LlamaCppConfig(Path("/m.gguf"), "m", 8192, launcher=NATIVE), port=1, api_key="k",
                           command=["llama-server"])  # fmt: skip
    assert (_flag(by_hand.argv, "-c"), _flag(by_hand.argv, "--kv-unified-per-slot")) == (8192, 8192)


def test_a_long_rope_model_gets_room_only_up_to_its_original_context(tmp_path: Path) -> None:
    """Phi-3-mini-128k is LongRoPE from 4,096: with --kv-unified b11434's per-sequence context is the whole -c
    (src/llama-context.cpp:294-295), and get_rope_factors (src/llama-model.cpp:2351) takes the long factors for
    every token once it passes 4,096. Served at 4,096, the usual -c 16,384 would answer every request with the
    128k factors; the room stops at 4,096 cells instead, and only a context already past it gets its usual room."""
    path = make_llama_shapes(tmp_path / "phi.gguf", PHI3_MINI, "phi-3-mini-128k-shapes", long_rope=4096)
    facts = facts_from_gguf(read_gguf_header(path), "phi")
    assert facts.long_rope_context == 4096 and facts.max_position == 131072

    def cells(n_ctx: int) -> tuple[int, int]:
        found = candidates(facts, "m.gguf", (), 64 * GIB, min_context=n_ctx, max_context=n_ctx, launcher=NATIVE)
        chosen = _rung(found, n_ctx)
        argv = plan_argv(chosen, served_name="m", gguf="m.gguf")
        assert ("none past its original 4,096" in chosen.reason) == (n_ctx <= 4096)
        return _flag(argv, "-c"), _flag(argv, "--kv-unified-per-slot")

    assert cells(4096) == (4096, 4096)  # no room: the short factors, as the advertised 4,096 implies
    assert cells(2048) == (4096, 2048)  # room up to the original context
    assert cells(8192) == (4 * 8192, 8192)  # past it already: long factors with or without the room
    plain = facts_from_gguf(read_gguf_header(make_llama_shapes(tmp_path / "l.gguf", PHI3_MINI, "plain")), "l")
    assert plain.long_rope_context == 0


def test_a_long_rope_config_is_known_before_the_gguf_is_local() -> None:
    config = json.loads((CONFIGS / "Llama-3.1-8B.json").read_text())
    config["rope_scaling"] = {"type": "longrope", "long_factor": [1.0] * 64, "short_factor": [1.0] * 64}
    config["original_max_position_embeddings"] = 4096
    assert estimate_gguf_facts(facts_from_config(config, "phi"), config, 4.5).long_rope_context == 4096
    assert _facts("Llama-3.1-8B").long_rope_context == 0  # llama3 rope_scaling: fixed rope_freqs, no switch
