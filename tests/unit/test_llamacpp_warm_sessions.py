"""llama-server's prompt cache in RAM and context checkpoints: set on purpose, sized by the plan from the
RAM its own terms leave, and counted in it (b11434 would otherwise take 8 GiB of RAM nobody planned)."""

from __future__ import annotations

import json
from pathlib import Path

from backends import llamacpp
from backends.llamacpp import estimate_gguf_facts, warm_sessions
from backends.llamacpp.gguf_facts import GgufFacts
from backends.llamacpp.ladder import candidates
from backends.llamacpp.placement import HOST_MARGIN_BYTES
from gateway.core.devices import GIB, MIB, Inventory, parse_gpu_spec
from gateway.core.model_facts import facts_from_config
from gateway.core.policy import Policy
from gateway.planning.planner import evaluate_and_choose
from tests.unit.plan_helpers import engine_plans

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _facts(name: str) -> GgufFacts:
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    return estimate_gguf_facts(facts_from_config(config, name), config, 4.5)


def _plan(name: str, ram_gib: float, min_context: int = 8192) -> llamacpp.LlamaCppCandidate:
    inventory = Inventory(parse_gpu_spec("1x24GiB"), int(ram_gib * GIB), int(ram_gib * GIB), source="simulated")
    engines = engine_plans(name, gguf_facts=_facts(name), launcher="native")
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
    sliding = sum(1 for layer in range(gpt_oss.num_layers) if llamacpp.placement.is_sliding(gpt_oss, layer))
    per_token = llamacpp.placement.kv_bytes_per_token_layer(gpt_oss, "f16", 0)
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
    found = candidates(facts, "m.gguf", (), 64 * GIB, min_context=8192, max_context=None, launcher="python")
    assert all(c.warm.host_bytes == 0 and "prompt cache" not in c.reason for c in found)
