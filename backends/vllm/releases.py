"""What each vLLM release can load and how it stores the KV cache: a small table, read from the
releases' own source (PyPI sdists 0.14.0, 0.16.0–0.19.0, 0.21.0), each row sourced.

A plan for a release that cannot load the architecture or the quantization says so and prints no
command; a release older than every row here is assumed to load what it is not listed as lacking.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from gateway.core.model_facts import ModelFacts

DEFAULT_VERSION = "0.32.0"  # assumed when vLLM is not installed beside the gateway

# Architectures (config.json "architectures") and the first release whose
# vllm/model_executor/models/registry.py lists them. Absent from this table: assumed loadable.
ARCHITECTURE_SINCE = {
    # absent from 0.14.0's registry.py, present in 0.16.0's; the 0.15.0 wheel has it (issue 15)
    "Glm4MoeLiteForCausalLM": "0.15.0",
    # absent from 0.14.0's registry.py, present in 0.16.0's
    "GlmMoeDsaForCausalLM": "0.16.0",
    # absent from 0.18.0's registry.py, present in 0.19.0's (models/gemma4.py, gemma4_mm.py)
    "Gemma4ForCausalLM": "0.19.0",
    "Gemma4ForConditionalGeneration": "0.19.0",
}

# vllm/transformers_utils/model_arch_config_convertor.py, ``is_deepseek_mla``:
#     elif self.hf_text_config.model_type in ("deepseek_v2", "deepseek_v3", "deepseek_v32",
#         "deepseek_mtp", "kimi_k2", "kimi_linear", "longcat_flash", "pangu_ultra_moe",
#         "pangu_ultra_moe_mtp"):                                          # 0.14.0
#         return self.hf_text_config.kv_lora_rank is not None
# 0.16.0 adds "glm_moe_dsa", "glm4_moe_lite", "glm4_moe_lite_mtp" (glm4_moe_lite: PR #32759, in
# the 0.15.0 wheel); 0.17.0 adds "AXK1", "bailing_hybrid"; 0.21.0 adds "deepseek_v4" (not in 0.19.0).
MLA_MODEL_TYPES_SINCE = {
    "deepseek_v2": "0.7.0",
    "deepseek_v3": "0.7.0",
    "deepseek_v32": "0.14.0",
    "deepseek_mtp": "0.14.0",
    "kimi_k2": "0.9.0",
    "kimi_linear": "0.14.0",
    "longcat_flash": "0.14.0",
    "pangu_ultra_moe": "0.14.0",
    "pangu_ultra_moe_mtp": "0.14.0",
    "glm4_moe_lite": "0.15.0",
    "glm4_moe_lite_mtp": "0.15.0",
    "glm_moe_dsa": "0.16.0",
    "AXK1": "0.17.0",
    "bailing_hybrid": "0.17.0",
    "deepseek_v4": "0.21.0",
}

# On compute capability 12.x the only MLA backend is TRITON_MLA. 0.17.0
# vllm/v1/attention/backends/mla/triton_mla.py:
#     supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto", "bfloat16"]
#     ...  raise NotImplementedError("FP8 Triton MLA not yet supported")
# 0.18.0 lists "auto", "float16", "bfloat16", "fp8", "fp8_e4m3".
MLA_FP8_KV_ON_CC12_SINCE = "0.18.0"

# Quantization methods (``QuantizationMethods`` in vllm/model_executor/layers/quantization/__init__.py):
# awq, gptq, fp8, modelopt_fp4 (nvfp4), compressed-tensors (nvfp4, fp8, int8) and mxfp4 are all in
# 0.14.0 and 0.21.0, so no release here refuses the method itself. Per model, what is reported:
QUANTIZATION_SINCE = {
    # the NVFP4 GLM-4.7-Flash checkpoints are reported not to load before 0.24 (issue 15, item 4)
    ("glm4_moe_lite", "nvfp4"): "0.24.0",
}

# --language-model-only (MultiModalConfig.language_model_only) appears in 0.17.0's
# vllm/engine/arg_utils.py; 0.16.0 has no such flag.
LANGUAGE_MODEL_ONLY_SINCE = "0.17.0"

# "CUDA graph memory profiling is enabled (default since v0.21.0)" (0.21.0 v1/worker/gpu_worker.py):
# graphs are subtracted before the KV cache is sized; earlier releases captured them on top.
CUDAGRAPH_RESERVED_SINCE = "0.21.0"


def parse_version(text: str) -> Version:
    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return Version(DEFAULT_VERSION)


def at_least(version: str, since: str) -> bool:
    return parse_version(version) >= Version(since)


def cannot_load(facts: ModelFacts, version: str) -> str | None:
    """Why this release cannot load the checkpoint (architecture or quantization), or None."""
    since = ARCHITECTURE_SINCE.get(facts.architecture)
    if since and not at_least(version, since):
        return (
            f"vLLM {version} cannot load {facts.architecture} (in vLLM's model registry since {since}): "
            f"install vLLM {since} or later"
        )
    since = QUANTIZATION_SINCE.get((facts.model_type, facts.quantization or ""))
    if since and not at_least(version, since):
        return (
            f"vLLM {version} cannot load this {facts.quantization} {facts.model_type} checkpoint "
            f"(reported to load from {since}): install vLLM {since} or later"
        )
    return None


def uses_mla(facts: ModelFacts, version: str) -> bool:
    """``is_deepseek_mla`` of this release: the model type is listed and kv_lora_rank is set."""
    since = MLA_MODEL_TYPES_SINCE.get(facts.model_type)
    return facts.is_mla and since is not None and at_least(version, since)


def fp8_kv_supported(facts: ModelFacts, capability: tuple[int, int], version: str) -> bool:
    """Whether ``--kv-cache-dtype fp8`` has a kernel: MLA on 12.x only since 0.18.0."""
    if uses_mla(facts, version) and capability[0] == 12:
        return at_least(version, MLA_FP8_KV_ON_CC12_SINCE)
    return True


def language_model_only(facts: ModelFacts, version: str) -> bool:
    """Text-only serving of a multimodal checkpoint: pass the flag so the towers are neither loaded
    nor profiled (vLLM 0.21 logs "running in text-only mode" and loads fewer bytes)."""
    return facts.vision_bytes > 0 and at_least(version, LANGUAGE_MODEL_ONLY_SINCE)
