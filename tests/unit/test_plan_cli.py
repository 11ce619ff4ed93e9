"""`gateway plan` end to end in-process: catalog names, local directories, GGUF files; JSON; exit codes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from gateway.backends.vllm.checkpoint_facts import facts_from_dir
from gateway.cli.commands import main
from tests.extras import needs_embedded_model, needs_native_llama_server

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_glm_on_two_5090s_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _plan(capsys, "--model", "glm-4.7-flash", "--gpus", "2x32607MiB@12.0", "--ram", "64GiB", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["decision"]["backend"] == "vllm"
    assert "vllm 0.32.0" in plan["engine_version"]
    chosen = plan["candidates"][plan["decision"]["candidate"]]
    expected = {
        "tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "max_num_seqs", "kv_cache_dtype",
        "enforce_eager", "cpu_offload_gb", "kv_bytes_per_token", "kv_tokens", "max_fitting_model_len",
        "max_concurrency", "argv", "env", "reason", "fits", "checkpoint", "max_num_batched_tokens",
    }  # fmt: skip
    assert expected <= set(chosen)
    assert set(chosen["memory_gib"]) == {
        "total_per_gpu", "budget_per_gpu", "weights_per_gpu", "activation_peak", "non_torch", "cudagraph",
        "kv_cache_per_gpu", "mtp_weights_per_gpu",
    }  # fmt: skip
    llama = [c for c in plan["candidates"] if c["backend"] == "llamacpp"]
    assert llama and {"n_gpu_layers", "tensor_split", "n_ctx", "kv_type", "memory_mib"} <= set(llama[0])
    assert set(llama[0]["memory_mib"]["GPU0"]) >= {"model", "kv", "compute"} and "host" in llama[0]["memory_mib"]


def test_human_output_leads_with_the_decision_and_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29: the decision's figures and its one line of why first, the command under them, the
    whole plan in about 30 lines; the memory terms of every rung under --verbose. One engine (--replicas 1):
    on its own this machine plans a replica per GPU (tests/unit/test_plan_replicas.py)."""
    code, out, _ = _plan(
        capsys, "--model", "glm-4.7-flash", "--gpus", "2x32607MiB@12.0", "--ram", "64GiB", "--replicas", "1"
    )
    lines = out.splitlines()
    assert code == 0 and len(lines) <= 30
    assert lines[0].startswith("decision: vLLM: unsloth/GLM-4.7-Flash-NVFP4 (nvfp4), TP2, context 202,752")
    assert "util 0.92" in lines[0] and "tokens/s" in lines[0]
    assert lines[1].startswith("why: vLLM meets the floor without offload")
    assert lines[2] == "command (the engine alone on port 8000, its key from $GATEWAY_API_KEY):"
    assert lines[3].startswith("  PYTORCH_ALLOC_CONF=expandable_segments:True") and " vllm serve unsloth/" in lines[3]
    assert "KV/GPU" not in out and "(every rung: --verbose; every figure: --json)" in out
    code, verbose, _ = _plan(
        capsys, "--model", "glm-4.7-flash", "--gpus", "2x32607MiB@12.0", "--ram", "64GiB", "--replicas", "1", "-v"
    )
    assert code == 0 and verbose.startswith(lines[0]) and "weights" in verbose and "KV/GPU" in verbose


@needs_native_llama_server
def test_the_printed_command_can_be_pasted(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15 (9): no PORT/KEY placeholders; the real port, the key from the environment."""
    # llama.cpp alone: on these cards vLLM now runs the NVFP4 checkpoint (ModelOpt NVFP4 needs 7.5)
    args = ("--model", "glm-4.7-flash", "--gpus", "2x16GiB", "--ram", "64GiB", "--port", "9123", "--engine", "llamacpp")
    code, out, _ = _plan(capsys, *args)
    command = out.splitlines()[3].strip()  # under the decision, its why and the command's heading
    assert code == 0 and command.startswith('LLAMA_API_KEY="$GATEWAY_API_KEY" llama-server ')
    assert command.endswith("--port 9123") and " PORT" not in command and "KEY " not in command.split("llama-server")[1]
    code, out, _ = _plan(capsys, *args, "--json")
    plan = json.loads(out)
    assert plan["command"] == command
    chosen = plan["candidates"][plan["decision"]["candidate"]]
    assert chosen["argv"][-1] == "PORT" and chosen["env"] == {"LLAMA_API_KEY": "KEY"}  # placeholders stay in argv


def test_what_was_estimated_reaches_the_output(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15 (9): the GGUF of the catalog entry is not local, so its size is estimated; say so."""
    code, out, _ = _plan(capsys, "--model", "glm-4.7-flash", "--gpus", "2x16GiB", "--ram", "64GiB", "--json")
    notes = json.loads(out)["notes"]
    assert code == 0 and any("GGUF size estimated at 4.85 bits/weight" in note for note in notes), notes
    code, out, _ = _plan(capsys, "--model", "glm-4.7-flash", "--gpus", "2x16GiB", "--ram", "64GiB")
    assert "note: llama.cpp: GGUF size estimated at 4.85 bits/weight" in out


def test_nothing_fits_without_a_gguf_says_so_and_suggests_a_quantized_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 15 (9): a checkpoint directory too big for the GPUs: every vLLM rung fails alike, and
    llama.cpp was never planned (no GGUF): the answer says both, once, and what to try."""
    config = {
        "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, _ = _plan(capsys, "--model", str(tmp_path), "--gpus", "2x24GiB", "--ram", "64GiB", "--json")
    plan = json.loads(out)
    reason = plan["decision"]["reason"]
    assert code == 2 and reason.startswith("nothing fits")
    assert "llama.cpp not planned: no GGUF for this model: pass --model FILE.gguf" in reason
    assert "a quantized checkpoint" in reason and reason.count("bfloat16 TP") == 1
    assert any(note.startswith("llama.cpp not planned: no GGUF") for note in plan["notes"])
    assert plan["command"] is None


def test_nothing_fits_exits_2_with_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _plan(capsys, "--model", "glm-4.7-flash", "--gpus", "1x8GiB", "--ram", "8GiB", "--json")
    assert code == 2
    plan = json.loads(out)
    assert plan["decision"]["backend"] is None and plan["decision"]["reason"].startswith("nothing fits")
    assert all(not c["fits"] and c["reason"] for c in plan["candidates"])


@pytest.mark.parametrize("bad", [["--gpus", "2xlots"], ["--ram", "much"], ["--model", "no-such-model"]])
def test_bad_input_exits_1_with_one_line(capsys: pytest.CaptureFixture[str], bad: list[str]) -> None:
    code, out, err = _plan(capsys, *bad)
    assert code == 1 and out == ""
    assert err.startswith("gateway: error:") and err.count("\n") == 1


def _checkpoint_dir(tmp_path: Path, with_index: bool) -> Path:
    (tmp_path / "config.json").write_text((CONFIGS / "Qwen3-8B.json").read_text())
    if with_index:
        index = {"metadata": {"total_size": 16_381_470_720}, "weight_map": {}}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    else:  # a shard with a header only: sizes come from data_offsets, the weights need not be present
        header = json.dumps({"a": {"dtype": "BF16", "shape": [1000, 1000], "data_offsets": [0, 2_000_000]}}).encode()
        (tmp_path / "model-00001-of-00001.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return tmp_path


def test_a_local_directory_plans_from_its_safetensors_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = _checkpoint_dir(tmp_path, with_index=True)
    assert facts_from_dir(directory).weight_bytes == 16_381_470_720
    code, out, _ = _plan(capsys, "--model", str(directory), "--gpus", "1x24GiB", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["decision"]["backend"] == "vllm"
    chosen = plan["candidates"][plan["decision"]["candidate"]]
    assert chosen["memory_gib"]["weights_per_gpu"] == pytest.approx(16_381_470_720 / 1024**3, abs=0.01)
    # 36 layers × K and V × 8 heads × 128, 2 bytes (fp8: 1, taken where auto KV falls short of the context)
    assert chosen["kv_bytes_per_token"] == 36 * 2 * 8 * 128 * (1 if chosen["kv_cache_dtype"] == "fp8" else 2)
    assert not any(c["backend"] == "llamacpp" for c in plan["candidates"])  # a checkpoint dir has no GGUF


def test_a_local_directory_without_index_reads_shard_headers(tmp_path: Path) -> None:
    directory = _checkpoint_dir(tmp_path, with_index=False)
    facts = facts_from_dir(directory)
    assert (facts.weight_bytes, facts.weight_bytes_source) == (2_000_000, "safetensors headers")


@needs_embedded_model
def test_a_gguf_file_plans_llamacpp_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.extras import embedded_model

    code, out, _ = _plan(capsys, "--model", str(embedded_model()), "--json")
    plan = json.loads(out)
    assert code == 0 and plan["decision"]["backend"] == "llamacpp"
    chosen = plan["candidates"][plan["decision"]["candidate"]]
    assert chosen["n_gpu_layers"] == 0 and chosen["n_ctx"] == 32768
    assert any(note.startswith("no NVIDIA GPU found") for note in plan["notes"])


def test_an_unreachable_hub_is_one_line_naming_the_fix(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = _plan(capsys, "--model", "Qwen/Qwen3-8B", "--gpus", "1x24GiB")
    assert code == 1 and out == ""
    assert "cannot read config.json of Qwen/Qwen3-8B from the hub" in err
    assert "pass a local checkpoint directory" in err


def test_a_pinned_length_is_what_the_user_wants_not_refused_by_the_default_minimum(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--model", "glm-4.7-flash", "--gpus", "2x80GiB@9.0", "--ram", "64GiB", "--json")
    code, out, _ = _plan(capsys, *args, "--context-length", "8192")
    plan = json.loads(out)
    assert code == 0 and plan["policy"]["min_context"] == 8192
    assert plan["candidates"][plan["decision"]["candidate"]]["max_model_len"] == 8192
    code, out, _ = _plan(capsys, *args, "--context-length", "8192", "--min-context", "16384")
    assert code == 2 and "< the 16,384 required" in json.loads(out)["decision"]["reason"]  # given explicitly: it wins


def test_a_user_catalog_entry_plans_from_its_own_config_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "m.json").write_text((CONFIGS / "Qwen3-8B.json").read_text())
    (tmp_path / "m.toml").write_text('name = "m"\nhf_config = "hf/m.json"\n[vllm]\ncheckpoint = "Qwen/Qwen3-8B"\n')
    code, out, err = _plan(capsys, "--catalog-dir", str(tmp_path), "--model", "m", "--gpus", "1x80GiB@9.0", "--json")
    assert code == 0, err
    assert json.loads(out)["decision"]["backend"] == "vllm"
