"""llama-cpp-python's argv and its log classifier, checked against logs recorded from the real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.backends import llamacpp
from gateway.backends.base import FailureKind

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"


def _launch(**overrides: object) -> list[str]:
    config = llamacpp.LlamaCppConfig(
        gguf=Path("/models/m.gguf"), served_name="m", context_length=8192, chat_format="gemma", threads=2
    )
    for key, value in overrides.items():
        object.__setattr__(config, key, value)
    launch = llamacpp.build_launch(config, port=4321, api_key="k3y", command=["py", "-m", "llama_cpp.server"])
    assert launch.env["API_KEY"] == "k3y", "llama-cpp-python's server settings read API_KEY"
    return launch.argv


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_argv_carries_model_name_port_key_and_context() -> None:
    argv = _launch()
    assert argv[:3] == ["py", "-m", "llama_cpp.server"]
    assert _flag(argv, "--model") == "/models/m.gguf"
    assert _flag(argv, "--model_alias") == "m"
    assert (_flag(argv, "--host"), _flag(argv, "--port")) == ("127.0.0.1", "4321")
    assert "k3y" not in argv, "the key is never on argv (/proc/PID/cmdline is world-readable)"
    assert _flag(argv, "--n_ctx") == "8192"
    assert _flag(argv, "--chat_format") == "gemma"
    assert _flag(argv, "--n_threads") == "2"
    assert _flag(argv, "--logits_all") == "False"


def test_no_chat_format_flag_when_the_gguf_template_is_used() -> None:
    assert "--chat_format" not in _launch(chat_format=None)


EXPECTED = {
    "llama-cpp-python-0.3.36-fail-missing.log": FailureKind.MODEL_FILE,
    "llama-cpp-python-0.3.36-fail-garbage.log": FailureKind.MODEL_FILE,
    "llama-cpp-python-0.3.36-fail-headeronly.log": FailureKind.MODEL_FILE,
    "llama-cpp-python-0.3.36-fail-trunc.log": FailureKind.MODEL_FILE,
    "llama-cpp-python-0.3.36-fail-nctx0.log": FailureKind.OUT_OF_MEMORY,
    "llama-cpp-python-0.3.36-fail-nctx10M.log": FailureKind.OUT_OF_MEMORY,
    "llama-cpp-python-0.3.36-fail-portinuse.log": FailureKind.PORT_IN_USE,
}


def _first_failure(name: str) -> llamacpp.Failure | None:
    for line in (LOGS / name).read_text().splitlines():
        if failure := llamacpp.classify(line):
            return failure
    return None


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_failures_are_classified(name: str) -> None:
    failure = _first_failure(name)
    assert failure is not None, f"nothing in {name} was recognised"
    assert failure.kind is EXPECTED[name]
    assert failure.fix


def test_a_healthy_start_has_no_failure_line() -> None:
    assert _first_failure("llama-cpp-python-0.3.36-ok-nctx8192.log") is None
