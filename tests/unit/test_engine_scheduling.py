"""What each engine is asked to do for many sessions at once: vLLM started with priority scheduling and a
cap per long prompt, llama-server's long prefill in its last slot, and the plan's sessions line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.backends.llamacpp.scheduling import batch_argv
from gateway.backends.llamacpp.scheduling import scheduling as llama_scheduling
from gateway.backends.vllm.argv import build_argv
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.backends.vllm.ladder import cpu_candidate
from gateway.backends.vllm.memory import Checkpoint, VllmFlags
from gateway.backends.vllm.scheduling import long_prefill_threshold
from gateway.backends.vllm.scheduling import scheduling as vllm_scheduling
from gateway.cli.commands import main
from gateway.core.devices import GIB
from gateway.core.policy import Goal, Policy
from tests.extras import needs_native_llama_server

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_runs_warm_turns_first_and_caps_what_a_long_prompt_takes_of_a_step() -> None:
    facts = checkpoint_facts(json.loads((CONFIGS / "Qwen2.5-3B.json").read_text()), "Qwen2.5-3B")
    flags = cpu_candidate(Checkpoint(facts.name, facts), 16 * GIB, "0.32.0", Policy()).flags
    argv = build_argv(facts.name, flags, served_name="m", tool_call_parser=None, reasoning_parser=None)
    assert _flag(argv, "--scheduling-policy") == "priority"
    budget = int(_flag(argv, "--max-num-batched-tokens"))
    assert budget == 256 and int(_flag(argv, "--long-prefill-token-threshold")) == budget // 4
    on_cpu = vllm_scheduling(flags, on_cpu=True)
    assert on_cpu.long_fields == {"priority": 1} and on_cpu.long_lane == 1
    gpu = VllmFlags(1, 0.9, 32768, 256, 8192)
    assert long_prefill_threshold(gpu) == 2048 and vllm_scheduling(gpu, on_cpu=False).long_lane * 2048 <= 8192 // 2


def test_vllm_never_caps_a_prompt_past_the_context() -> None:
    assert long_prefill_threshold(VllmFlags(1, 0.9, 1024, 4, 8192)) == 1024  # vLLM refuses one above the context
    assert long_prefill_threshold(VllmFlags(1, 0.9, 4096, 4, 32)) == 16


def test_llama_server_pins_the_long_prefill_to_its_last_slot() -> None:
    four = llama_scheduling(4)
    assert (four.long_lane, dict(four.long_fields)) == (1, {"id_slot": 3})
    one = llama_scheduling(1)  # llama-cpp-python's one slot: nothing runs beside a long prefill
    assert (one.long_lane, dict(one.long_fields)) == (0, {})


def test_llama_server_takes_one_ubatch_a_step_on_one_device_unless_told_otherwise() -> None:
    assert batch_argv(0) == batch_argv(1) == ["-b", "512"]  # CPU, one GPU
    assert batch_argv(2) == []  # several: the ubatches of a step are pipelined from device to device
    assert batch_argv(1, given=["llama-server", "-b", "16", "-ub", "16"]) == []  # the user's own batch stands
    assert batch_argv(1, given=["llama-server", "--ubatch-size=64"]) == []


def test_the_plan_says_how_many_sessions_it_keeps_warm() -> None:
    goal = Goal(sessions=8)
    assert goal.warm_sessions(4 * 131072, 131072) == (4, 16)  # four full contexts, sixteen 32k prompts
    assert goal.warm_sessions(20_000, 16_384) == (1, 1)  # a context below 32k: the prompt is the context


@needs_native_llama_server
def test_more_sessions_asked_get_a_larger_prompt_cache_and_the_plan_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def plan(sessions: int) -> dict[str, Any]:
        args = ["plan", "--model", "glm-4.7-flash", "--gpus", "2x24GiB", "--ram", "128GiB", "--engine", "llamacpp"]
        assert main([*args, "--llama-launcher", "native", "--sessions", str(sessions), "--json"]) == 0
        data: dict[str, Any] = json.loads(capsys.readouterr().out)
        return data

    few, many = plan(4), plan(32)
    assert few["sessions"]["asked"] == 4 and many["sessions"]["asked"] == 32
    assert many["sessions"]["warm_tokens"] > few["sessions"]["warm_tokens"]
    assert many["sessions"]["warm_at_typical_prompt"] > few["sessions"]["warm_at_typical_prompt"] >= 4
    assert few["sessions"]["at_once"] == 4
