"""The planner reads each vLLM release the way that release reads itself (issue 15, items 1–7).

Each test quotes the vLLM source it follows (release and file) or the recorded log it checks.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from gateway.backends import vllm
from gateway.backends.vllm import releases
from gateway.backends.vllm.checkpoint_facts import CheckpointFacts, checkpoint_facts
from gateway.backends.vllm.memory import capture_sizes, cuda_total, cudagraph_bytes
from gateway.cli.commands import build_parser
from gateway.cli.full_settings import load_settings
from gateway.core.devices import GIB, MIB, Device, Inventory, parse_gpu_spec
from gateway.core.policy import Pins, Policy
from gateway.planning.catalog import builtin_catalog
from gateway.planning.plan_report import render
from gateway.planning.planner import Plan, evaluate_and_choose
from tests.unit.plan_helpers import engine_plans

DATA = Path(__file__).resolve().parents[1] / "data"
SEED_003 = DATA / "logs" / "vllm-0.21.0-gpu-fail-oom-loading-nvfp4-tp2.log"
RTX_5090_PAIR = "2x32607MiB@12.0"
BLACKWELL_16GB_PAIR = "2x16303MiB@12.0"  # NVML: 15.92 GiB per card


def _machine(spec: str) -> Inventory:
    return Inventory(parse_gpu_spec(spec), 64 * GIB, 64 * GIB, source="simulated")


def _plan(name: str, checkpoints: list[vllm.Checkpoint], spec: str, version: str, pins: Pins | None = None) -> Plan:
    """A plan whose minimum context is the pinned one, as ``policy_for`` makes it."""
    engines = engine_plans(name, checkpoints=checkpoints, vllm_version=version)
    pins = pins or Pins()
    policy = Policy(min_context=pins.context_length or 32768, pins=pins)
    return evaluate_and_choose(name, engines, _machine(spec), policy)


def _glm() -> list[vllm.Checkpoint]:
    return vllm.BACKEND.read(builtin_catalog().resolve("glm-4.7-flash")).checkpoints


def _gemma_config() -> dict[str, object]:
    return dict(json.loads((DATA / "configs" / "gemma-4-31B-it.json").read_text()))


def _gemma_nvfp4(quant_file: bool = True) -> CheckpointFacts:
    """nvidia/Gemma-4-31B-IT-NVFP4: from its hf_quant_config.json, or (False) from config.json alone."""
    if not quant_file:
        return checkpoint_facts(_gemma_config(), "nvidia/Gemma-4-31B-IT-NVFP4", quantization="nvfp4")
    quant = json.loads((DATA / "configs" / "gemma-4-31B-it-nvfp4.hf_quant_config.json").read_text())
    return checkpoint_facts(_gemma_config(), "nvidia/Gemma-4-31B-IT-NVFP4", quant_file=quant)


# Item 1 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml_mib", "reported_gib", "where"),
    [
        (16303, None, "seed 003: 'GPU 0 has a total capacity of 15.47 GiB' (16 GB Blackwell, cc 12.0)"),
        (32607, 31.36, "RTX 5090 (cc 12.0), issue 15"),
        (46068, 44.42, "vllm-02: 'Free memory on device (43.93/44.42 GiB)' (L40S, cc 8.9)"),
        (81559, 79.10, "vllm-20: 'total_gpu_memory=79.10GiB' (H100 80GB HBM3, cc 9.0)"),
        (24564, 23.53, "vllm-08: 'Free memory on device (23.08/23.53 GiB)' (24 GB card)"),
    ],
)
def test_the_budget_is_a_share_of_the_cuda_total_which_the_recorded_logs_print(
    nvml_mib: int, reported_gib: float | None, where: str
) -> None:
    """0.21.0 vllm/v1/worker/utils.py request_memory:
    ``requested_memory = math.ceil(init_snapshot.total_memory * cache_config.gpu_memory_utilization)``
    where ``total_memory`` is ``mem_get_info``'s (CUDA's), not NVML's."""
    if reported_gib is None:
        found = re.search(r"total capacity of ([0-9.]+) GiB", SEED_003.read_text())
        assert found
        reported_gib = float(found.group(1))
    gpu = Device(0, where, nvml_mib * MIB, nvml_mib * MIB, (12, 0))
    assert abs(cuda_total(gpu) / GIB - reported_gib) < 0.07, where
    flags = vllm.VllmFlags(1, 0.9, 1024, 1, 1024)
    m = vllm.memory(vllm.Checkpoint("x", _glm()[0].facts), gpu, flags, "0.21.0")
    assert m.total == cuda_total(gpu) and m.budget == int(m.total * 0.9)


# Item 2 ---------------------------------------------------------------------------------------


def test_cuda_graph_sizes_follow_max_num_seqs_as_in_the_recorded_log() -> None:
    """0.21.0 vllm/config/vllm.py _set_cudagraph_sizes:
    ``max_cudagraph_capture_size = min(self.scheduler_config.max_num_seqs * decode_query_len * 2, 512)``."""
    logged = re.search(r"'cudagraph_capture_sizes': \[([0-9, ]*)\]", SEED_003.read_text())
    assert logged and [int(n) for n in logged.group(1).split(",")] == capture_sizes(1, 1024) == [1, 2]
    assert len(capture_sizes(256, 2048)) == 51 and capture_sizes(256, 2048)[-1] == 512
    assert capture_sizes(1024, 8192)[-1] == 512  # never above 512
    glm = _glm()[0].facts
    one = cudagraph_bytes(glm, vllm.VllmFlags(2, 0.92, 32768, 1, 2048))
    many = cudagraph_bytes(glm, vllm.VllmFlags(2, 0.92, 32768, 256, 2048))
    assert one < 0.15 * many and many > 1.8 * GIB  # 1.84 GiB at 256 sequences, not at one


# Item 3 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_type", "mla_in", "not_in"),
    [
        ("glm4_moe_lite", "0.16.0", "0.14.0"),
        ("glm_moe_dsa", "0.16.0", "0.14.0"),
        ("deepseek_v32", "0.14.0", None),
        ("kimi_linear", "0.14.0", None),
        ("longcat_flash", "0.14.0", None),
        ("deepseek_v4", "0.21.0", "0.19.0"),
    ],
)
def test_mla_follows_each_releases_is_deepseek_mla_list(model_type: str, mla_in: str, not_in: str | None) -> None:
    """vllm/transformers_utils/model_arch_config_convertor.py ``is_deepseek_mla`` (model_type in the
    release's list and kv_lora_rank set); 0.16.0 added glm_moe_dsa and glm4_moe_lite."""
    facts = dataclasses.replace(_glm()[0].facts, model_type=model_type)
    assert releases.uses_mla(facts, mla_in)
    assert vllm.kv_bytes_per_token(facts, 2, "auto", mla_in) == 47 * 576 * 2
    if not_in:
        assert not releases.uses_mla(facts, not_in)


def test_an_mla_model_run_without_mla_stores_k_and_v_padded_to_the_qk_head() -> None:
    """Without MLA, K and V are full heads and V is padded to qk_head_dim (nope + rope)."""
    config = json.loads((DATA / "configs" / "DeepSeek-V2-Lite.json").read_text())
    facts = checkpoint_facts({**config, "model_type": "not_listed_mla"}, "mla-not-listed")
    qk_head = facts.qk_nope_head_dim + facts.qk_rope_head_dim  # 192 > v_head_dim 128
    assert vllm.kv_bytes_per_token(facts, 1, "auto", "0.21.0") == facts.num_layers * 2 * facts.num_heads * qk_head * 2


def test_no_fp8_kv_for_mla_on_compute_capability_12_before_0_18() -> None:
    """0.17.0 v1/attention/backends/mla/triton_mla.py: ``supported_kv_cache_dtypes = ["auto",
    "bfloat16"]``, the only MLA backend on 12.x; 0.18.0 adds "fp8", "fp8_e4m3"."""
    before = _plan("glm-4.7-flash", _glm()[:1], RTX_5090_PAIR, "0.17.0")
    assert not [c for c in before.candidates_of("vllm") if c.flags.kv_cache_dtype == "fp8"]
    after = _plan("glm-4.7-flash", _glm()[:1], RTX_5090_PAIR, "0.18.0")
    assert [c for c in after.candidates_of("vllm") if c.flags.kv_cache_dtype == "fp8"]
    pinned = _plan("glm-4.7-flash", _glm()[:1], RTX_5090_PAIR, "0.17.0", Pins(engine={"kv_cache_dtype": "fp8"}))
    refused = pinned.candidates_of("vllm")
    assert refused and not any(c.fits or c.argv for c in refused)
    assert "TRITON_MLA takes KV auto/bfloat16" in refused[0].reason and "since vLLM 0.18.0" in refused[0].reason
    assert "triton_mla.py:" in refused[0].reason  # the line of 0.17.0 it rests on


# Item 4 ---------------------------------------------------------------------------------------


def test_a_release_that_cannot_load_the_architecture_says_so_and_prints_no_command() -> None:
    """0.14.0 vllm/model_executor/models/registry.py has no Glm4MoeLiteForCausalLM, 0.16.0's has
    (0.15.x is on PyPI as wheels only: no source was read for it, and 0.14.0's table answers)."""
    plan = _plan("glm-4.7-flash", _glm(), RTX_5090_PAIR, "0.14.0")
    candidates = plan.candidates_of("vllm")
    assert candidates and not any(c.fits or c.argv or c.startable for c in candidates)
    assert all("cannot load Glm4MoeLiteForCausalLM" in c.reason and "since 0.16.0" in c.reason for c in candidates)
    assert plan.decision_backend != "vllm"
    assert "vllm serve" not in render(plan)
    assert any("no vLLM command" in note for note in plan.notes)
    # 0.15.1: not read; 0.14.0 lacks it and 0.16.0 has it, so it is not refused, and the plan says
    # which release's source its gates come from
    assert releases.cannot_load(_glm()[0].facts, "0.15.1") is None
    gap = _plan("glm-4.7-flash", _glm(), RTX_5090_PAIR, "0.15.1")
    assert any("0.15.x: wheels only on PyPI, no source read" in note for note in gap.notes)


def test_the_nvfp4_glm_checkpoint_is_not_refused_before_0_24_only_noted() -> None:
    """Nothing in 0.16–0.21's source gates NVFP4 GLM-4.7-Flash (ModelOptNvFp4Config needs 7.5 in
    each): the plan starts it and notes that 0.24 adds a faster SM12x MoE path."""
    plan = _plan("glm-4.7-flash", _glm(), RTX_5090_PAIR, "0.21.0")
    nvfp4 = [c for c in plan.candidates_of("vllm") if c.checkpoint.quantization == "nvfp4"]
    assert any(c.fits and c.argv for c in nvfp4)
    assert any("0.24 adds a faster SM12x" in note for note in plan.notes)
    later = _plan("glm-4.7-flash", _glm(), RTX_5090_PAIR, "0.24.0")
    assert not any("0.24 adds a faster SM12x" in note for note in later.notes)


# Item 5 ---------------------------------------------------------------------------------------

SEED_003_PINS = Pins(
    context_length=1024,
    engine={
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 1024,
        "kv_cache_dtype": "fp8",
    },
)


def test_modelopt_nvfp4_gemma_keeps_attention_in_bf16_and_does_not_fit_two_16_gb_cards() -> None:
    """Seed 003: vLLM 0.21.0 ran out of memory loading nvidia/Gemma-4-31B-IT-NVFP4 at TP2 on 2 × 16 GB
    (14.01 GiB allocated by PyTorch on a 15.47 GiB card). Its hf_quant_config.json excludes every
    self_attn, lm_head and the vision tower; counting all linear layers as NVFP4 said it fits."""
    assert "OutOfMemory" in SEED_003.read_text() or "CUDA out of memory" in SEED_003.read_text()
    facts = _gemma_nvfp4()
    assert facts.quantization == "nvfp4" and {"attention", "lm_head", "vision"} <= set(facts.quant_kept)
    plan = _plan("gemma-4-31b", [vllm.Checkpoint(facts.name, facts)], BLACKWELL_16GB_PAIR, "0.21.0", SEED_003_PINS)
    refused = plan.candidates_of("vllm")
    assert refused and not any(c.fits for c in refused)
    assert refused[0].memory.weights > 14 * GIB and "exceed the 15.47 GiB card" in refused[0].reason
    naive_config = {
        **_gemma_config(),
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": []},
    }
    naive = checkpoint_facts(naive_config, "all-linear-nvfp4")
    assert naive.quant_kept == ()
    wrong = _plan("gemma-4-31b", [vllm.Checkpoint("naive", naive)], BLACKWELL_16GB_PAIR, "0.21.0", SEED_003_PINS)
    assert any(c.fits for c in wrong.candidates_of("vllm"))  # what the planner said before


def test_with_only_config_json_the_known_exclusions_are_used_and_marked_as_an_estimate() -> None:
    estimated = _gemma_nvfp4(quant_file=False)
    assert estimated.quant_kept == _gemma_nvfp4().quant_kept
    assert estimated.weight_bytes == _gemma_nvfp4().weight_bytes
    assert estimated.quant_kept_source.startswith("estimate")
    plan = _plan("gemma-4-31b", [vllm.Checkpoint(estimated.name, estimated)], BLACKWELL_16GB_PAIR, "0.21.0")
    rejected = plan.candidates_of("vllm")[0]
    assert "estimated from config.json" in rejected.reason and "a known list, estimated" in rejected.reason
    assert any("no hf_quant_config.json read" in note for note in plan.notes)
    assert rejected.to_json()["weights_estimated"] is True


# Item 6 ---------------------------------------------------------------------------------------


def test_gemma4_kv_layout_sliding_16_heads_of_256_full_4_heads_of_512() -> None:
    """0.21.0 vllm/model_executor/models/gemma4.py: full layers use ``global_head_dim`` and, with
    ``attention_k_eq_v``, ``num_global_key_value_heads`` (K loaded into both K and V slots)."""
    facts = checkpoint_facts(_gemma_config(), "google/gemma-4-31B-it")
    assert (facts.sliding_layers, facts.num_layers, facts.sliding_window) == (50, 60, 1024)
    sliding, full = 50 * 2 * 16 * 256 * 2, 10 * 2 * 4 * 512 * 2
    assert vllm.kv_bytes_per_token(facts, 1, "auto", "0.21.0") == sliding + full == 901_120
    assert vllm.kv_bytes_per_token(facts, 2, "auto", "0.21.0") == (sliding + full) // 2
    assert vllm.kv_bytes_per_token(facts, 8, "auto", "0.21.0") == 50 * 2 * 2 * 256 * 2 + 10 * 2 * 1 * 512 * 2
    flags = vllm.VllmFlags(1, 0.9, 32768, 1, 2048)
    gpu = parse_gpu_spec("1x80GiB@9.0")[0]
    m = vllm.memory(vllm.Checkpoint("g", facts), gpu, flags, "0.21.0")
    window = 1024 - 1 + 2048  # sliding layers keep window − 1 + max_num_batched_tokens tokens
    one_request = 50 * 2 * 16 * 256 * 2 * window + full * m.max_fitting_model_len
    assert one_request <= m.kv_cache < one_request + full + 50 * 2 * 16 * 256 * 2


def test_text_only_serving_of_a_multimodal_checkpoint_passes_language_model_only() -> None:
    """--language-model-only (0.17.0+ arg_utils.py; "running in text-only mode" in seed 003's log):
    the vision tower is neither copied to every GPU nor profiled."""
    facts = checkpoint_facts(_gemma_config(), "google/gemma-4-31B-it")
    assert facts.vision_bytes > 0.5 * GIB
    plan = _plan("gemma-4-31b", [vllm.Checkpoint(facts.name, facts)], "2x80GiB@9.0", "0.21.0")
    chosen = plan.chosen
    assert isinstance(chosen, vllm.VllmCandidate) and chosen.flags.language_model_only
    assert "--language-model-only" in chosen.argv
    with_tower = vllm.memory(
        chosen.checkpoint,
        plan.inventory.gpus[0],
        dataclasses.replace(chosen.flags, language_model_only=False),
        "0.21.0",
    )
    assert with_tower.weights - chosen.memory.weights == facts.vision_bytes
    assert not releases.language_model_only(facts, "0.16.0")  # no such flag before 0.17.0
    text_only = checkpoint_facts(json.loads((DATA / "configs" / "Qwen3-8B.json").read_text()), "Qwen3-8B")
    assert not releases.language_model_only(text_only, "0.21.0")


def test_gemma4_is_not_in_the_registry_before_0_19() -> None:
    facts = checkpoint_facts(_gemma_config(), "google/gemma-4-31B-it")
    assert "since 0.19.0" in (releases.cannot_load(facts, "0.18.0") or "")
    assert releases.cannot_load(facts, "0.19.0") is None


# Item 7 ---------------------------------------------------------------------------------------


def test_a_kv_cache_pin_that_does_not_fit_beside_the_weights_is_refused() -> None:
    """With --kv-cache-memory-bytes 0.21.0 gpu_worker.py skips profiling and allocates the pinned
    bytes; 10 GiB beside 27.89 GiB of weights on a 31.84 GiB card runs out of memory."""
    pins = Pins(context_length=32768, engine={"tensor_parallel_size": 2, "kv_cache_memory_bytes": 10 * GIB})
    plan = _plan("glm-4.7-flash", _glm()[:1], RTX_5090_PAIR, "0.32.0", pins)
    candidates = plan.candidates_of("vllm")
    assert candidates and not any(c.fits for c in candidates)
    assert "runs out of memory allocating the KV cache" in candidates[0].reason
    small = _plan(
        "glm-4.7-flash",
        _glm()[:1],
        RTX_5090_PAIR,
        "0.32.0",
        Pins(
            context_length=32768,
            engine={
                "tensor_parallel_size": 2,
                "kv_cache_memory_bytes": 2 * GIB,
                "max_num_seqs": 8,
                "enforce_eager": True,
                "gpu_memory_utilization": 0.9,
            },
        ),
    )
    assert any(c.fits for c in small.candidates_of("vllm"))


@pytest.mark.parametrize(
    ("given", "context", "auto"),
    [("auto", None, True), ("-1", None, True), ("32k", 32000, None), ("32K", 32768, None), ("40960", 40960, None)],
)
def test_vllms_own_max_model_len_forms_are_accepted(given: str, context: int | None, auto: bool | None) -> None:
    """0.21.0 vllm/utils/argparse_utils.py human_readable_int_or_auto: '1k' → 1,000, '1K' → 1,024,
    '-1' or 'auto' → -1."""
    args = build_parser().parse_args(["plan", "--model", "m", "--max-model-len", given])
    pins = Pins.from_values(load_settings({"context_length": args.context_length}))
    assert (pins.context_length, pins.context_auto) == (context, auto)


def test_kv_cache_memory_bytes_takes_vllms_suffixes() -> None:
    for given, expected in (("4G", 4 * GIB), ("4g", 4 * 10**9), ("512M", 512 * MIB), ("4294967296", 4 * GIB)):
        args = build_parser().parse_args(["plan", "--model", "m", "--kv-cache-memory-bytes", given])
        assert load_settings({"kv_cache_memory_bytes": args.kv_cache_memory_bytes}).kv_cache_memory_bytes == expected


def test_max_model_len_auto_is_the_exact_binary_search_result() -> None:
    """0.21.0 v1/core/kv_cache_utils.py _auto_fit_max_model_len: the largest length that fits, not
    rounded ("Auto-fit max_model_len: reduced from %d to %d")."""
    plan = _plan("glm-4.7-flash", _glm()[:1], RTX_5090_PAIR, "0.32.0", Pins(context_auto=True))
    fitting = [c for c in plan.candidates_of("vllm") if c.fits]
    assert fitting and all(c.context_length == min(202752, c.memory.max_fitting_model_len) for c in fitting)
    assert any(c.context_length % 1024 for c in fitting)
