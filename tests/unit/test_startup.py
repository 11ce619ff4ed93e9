"""Choosing the model, the context and the placement before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends import llamacpp
from gateway.catalog import ModelEntry, builtin_catalog
from gateway.errors import ConfigError, ModelError
from gateway.hardware import GIB, Inventory, parse_gpu_spec
from gateway.settings import Settings
from gateway.startup import choose_model, context_policy, decide

CPU = Inventory((), 24 * GIB, 20 * GIB, source="none")


def _settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(state_dir=tmp_path, llama_cpp_python_command=["py", "-m", "llama_cpp.server"], **values)  # type: ignore[arg-type]


def test_no_model_and_no_gpu_serves_the_embedded_default(tmp_path: Path) -> None:
    assert choose_model(_settings(tmp_path), builtin_catalog(), gpu_count=0).name == "gemma-3-270m"


def test_no_model_on_a_gpu_machine_asks_for_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pass --model"):
        choose_model(_settings(tmp_path), builtin_catalog(), gpu_count=2)


def test_context_is_the_model_maximum_capped_on_cpu_and_uncapped_on_gpus(tmp_path: Path) -> None:
    huge = ModelEntry(name="h", max_context=202752)
    assert context_policy(_settings(tmp_path), huge, None, has_gpus=False).max_context == llamacpp.CPU_CONTEXT_CAP
    assert context_policy(_settings(tmp_path), huge, None, has_gpus=True).max_context == 202752
    small = ModelEntry(name="s", max_context=8192)
    policy = context_policy(_settings(tmp_path), small, None, has_gpus=False)
    assert (policy.min_context, policy.max_context) == (8192, 8192)


def test_requested_context_is_pinned_up_to_the_model_maximum(tmp_path: Path) -> None:
    entry = ModelEntry(name="s", max_context=8192)
    policy = context_policy(_settings(tmp_path, context_length=4096), entry, None, has_gpus=False)
    assert policy.pinned == {"n_ctx": 4096} and policy.min_context == 4096
    with pytest.raises(ConfigError, match="exceeds s's maximum of 8192"):
        context_policy(_settings(tmp_path, context_length=9000), entry, None, has_gpus=False)


def test_the_embedded_default_on_cpu_is_planned_all_in_ram(tmp_path: Path) -> None:
    decision = decide(_settings(tmp_path), machine=CPU)
    argv = decision.launch.argv
    assert argv[argv.index("--n_gpu_layers") + 1] == "0"
    assert argv[argv.index("--n_ctx") + 1] == "32768" == str(decision.route.context_length)
    assert "--tensor_split" not in argv and "--flash_attn" not in argv


def test_on_two_gpus_serve_starts_the_planned_split(tmp_path: Path) -> None:
    gpus = Inventory(parse_gpu_spec("1x12GiB,1x24GiB"), 64 * GIB, 64 * GIB, source="simulated")
    decision = decide(_settings(tmp_path, model="gemma-3-270m"), machine=gpus)
    chosen = decision.plan.chosen
    assert isinstance(chosen, llamacpp.LlamaCppCandidate)
    argv = decision.launch.argv
    assert argv[argv.index("--n_gpu_layers") + 1] == str(chosen.placement.n_gpu_layers) == "19"
    split = [float(s) for s in argv[argv.index("--tensor_split") + 1 : argv.index("--tensor_split") + 3]]
    assert split == list(chosen.placement.tensor_split) and split[0] < split[1]
    assert argv[argv.index("--flash_attn") + 1] == "True"


def test_a_vllm_only_model_is_refused_with_the_alternative(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no GGUF for llama.cpp"):
        decide(_settings(tmp_path, model="Qwen/Qwen3-8B"), machine=CPU)


def test_a_gguf_that_is_not_gguf_fails_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match="is not a GGUF file"):
        decide(_settings(tmp_path, model=str(bad)), machine=CPU)
