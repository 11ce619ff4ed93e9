"""Choosing the model and the context to serve before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends import llamacpp
from gateway.catalog import ModelEntry, builtin_catalog
from gateway.errors import ConfigError, ModelError
from gateway.settings import Settings
from gateway.startup import choose_model, context_for, decide


def _settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(state_dir=tmp_path, **values)  # type: ignore[arg-type]


def test_no_model_and_no_gpu_serves_the_embedded_default(tmp_path: Path) -> None:
    assert choose_model(_settings(tmp_path), builtin_catalog(), gpu_count=0).name == "gemma-3-270m"


def test_no_model_on_a_gpu_machine_asks_for_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pass --model"):
        choose_model(_settings(tmp_path), builtin_catalog(), gpu_count=2)


def test_context_defaults_to_the_model_maximum_capped_for_cpu(tmp_path: Path) -> None:
    small = ModelEntry(name="s", max_context=8192)
    huge = ModelEntry(name="h", max_context=202752)
    assert context_for(_settings(tmp_path), small, None) == 8192
    assert context_for(_settings(tmp_path), huge, None) == llamacpp.CPU_CONTEXT_CAP
    assert context_for(_settings(tmp_path), ModelEntry(name="u"), 16384) == 16384
    assert context_for(_settings(tmp_path), ModelEntry(name="u"), None) == llamacpp.FALLBACK_CONTEXT


def test_requested_context_is_honoured_up_to_the_model_maximum(tmp_path: Path) -> None:
    entry = ModelEntry(name="s", max_context=8192)
    assert context_for(_settings(tmp_path, context_length=4096), entry, None) == 4096
    with pytest.raises(ConfigError, match="exceeds s's maximum of 8192"):
        context_for(_settings(tmp_path, context_length=9000), entry, None)


def test_a_vllm_only_model_is_refused_with_the_alternative(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no GGUF for llama.cpp"):
        decide(_settings(tmp_path, model="Qwen/Qwen3-8B"), gpu_count=0)


def test_a_gguf_that_is_not_gguf_fails_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match="is not a GGUF file"):
        decide(_settings(tmp_path, model=str(bad), llama_cpp_python_command=["true"]), gpu_count=0)
