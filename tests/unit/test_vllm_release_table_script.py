"""scripts/vllm_release_table.py on a small sdist written here: each fact the planner reads is
extracted from the source as written (nothing imported), with its file and line; and the checked-in
tables are what the script writes (their release, sdist digest and the fields the gates read)."""

from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "gateway" / "backends" / "vllm" / "release_data"

FILES = {
    "vllm/model_executor/models/registry.py": """
        _TEXT_GENERATION_MODELS = {
            "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
            "Glm4MoeLiteForCausalLM": ("glm4_moe_lite", "Glm4MoeLiteForCausalLM"),
        }
        _PREVIOUSLY_SUPPORTED_MODELS = {"OldForCausalLM": "0.1"}
    """,
    "vllm/transformers_utils/model_arch_config_convertor.py": """
        class C:
            def is_deepseek_mla(self) -> bool:
                if self.hf_text_config.model_type in ("deepseek_v2", "axk1"):
                    return True
                return False
    """,
    "vllm/config/speculative.py": """
        MTPModelTypes = Literal["deepseek_mtp", "glm4_moe_lite_mtp"]
        class SpeculativeConfig:
            @staticmethod
            def hf_config_override(hf_config):
                if hf_config.model_type in ("deepseek_v3",):
                    hf_config.model_type = "deepseek_mtp"
                if hf_config.architectures[0] == "Glm4MoeLiteForCausalLM":
                    hf_config.model_type = "glm4_moe_lite_mtp"
                return hf_config
    """,
    "vllm/v1/attention/backend.py": """
        class AttentionBackend:
            supported_kv_cache_dtypes: ClassVar[list] = ["auto"]
            @classmethod
            def supports_compute_capability(cls, capability) -> bool:
                return True
    """,
    "vllm/v1/attention/backends/registry.py": """
        class AttentionBackendEnum(Enum):
            TRITON_MLA = "vllm.v1.attention.backends.mla.triton_mla.TritonMLABackend"
            CUTLASS_MLA = "vllm.v1.attention.backends.mla.cutlass_mla.CutlassMLABackend"
            FLASHINFER = "vllm.v1.attention.backends.flashinfer.FlashInferBackend"
    """,
    "vllm/v1/attention/backends/mla/triton_mla.py": """
        class TritonMLABackend(AttentionBackend):
            supported_kv_cache_dtypes: ClassVar[list] = ["auto", "bfloat16"]
    """,
    "vllm/v1/attention/backends/mla/cutlass_mla.py": """
        class CutlassMLABackend(AttentionBackend):
            supported_kv_cache_dtypes: ClassVar[list] = ["auto", "fp8"]
            @classmethod
            def supports_compute_capability(cls, capability) -> bool:
                return capability.major == 10
    """,
    "vllm/v1/attention/backends/flashinfer.py": """
        class FlashInferBackend(AttentionBackend):
            supported_kv_cache_dtypes: ClassVar[list] = ["auto", "fp8"]
            @classmethod
            def supports_compute_capability(cls, capability) -> bool:
                return capability >= DeviceCapability(8, 0) and capability <= DeviceCapability(12, 1)
    """,
    "vllm/platforms/cuda.py": """
        def _get_backend_priorities(use_mla, device_capability, kv_cache_dtype=None):
            if use_mla:
                if device_capability.major == 10:
                    return [AttentionBackendEnum.CUTLASS_MLA, AttentionBackendEnum.TRITON_MLA]
                return [AttentionBackendEnum.TRITON_MLA]
            return [AttentionBackendEnum.FLASHINFER]
    """,
    "vllm/model_executor/layers/quantization/__init__.py": """
        def get_quantization_config(quantization):
            method_to_config: dict[str, type] = {"fp8": Fp8Config, "modelopt": ModelOptFp8Config}
            return method_to_config[quantization]
    """,
    "vllm/model_executor/layers/quantization/fp8.py": """
        class Fp8Config(QuantizationConfig):
            @classmethod
            def get_min_capability(cls) -> int:
                return 75
    """,
    "vllm/model_executor/layers/quantization/modelopt.py": """
        class ModelOptFp8Config(QuantizationConfig):
            @classmethod
            def get_min_capability(cls) -> int:
                return 89
            @classmethod
            def override_quantization_method(cls, hf_quant_cfg, user_quant):
                if "FP8" in hf_quant_cfg.get("quant_algo", ""):
                    return "modelopt"
    """,
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py": """
        class CompressedTensorsConfig:
            def _get_scheme_from_parts(self, weight_quant, input_quant):
                if cutlass_fp4_supported():
                    return CompressedTensorsW4A4Fp4()
                else:
                    return CompressedTensorsW4A16Fp4()
    """,
    "vllm/model_executor/layers/quantization/compressed_tensors/schemes/w4a4.py": """
        class CompressedTensorsW4A4Fp4(CompressedTensorsScheme):
            @classmethod
            def get_min_capability(cls) -> int:
                if envs.VLLM_USE_NVFP4_CT_EMULATIONS:
                    return 80
                return 100
        class CompressedTensorsW4A16Fp4(CompressedTensorsScheme):
            @classmethod
            def get_min_capability(cls) -> int:
                return 80
    """,
    "vllm/tool_parsers/__init__.py": '_TOOL_PARSERS_TO_REGISTER = {"glm47": ("glm47", "Glm47"), "hermes": ("h", "H")}',
    "vllm/reasoning/__init__.py": '_REASONING_PARSERS_TO_REGISTER = {"glm45": ("glm45", "Glm45")}',
    "vllm/config/cache.py": """
        class CacheConfig:
            gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)
    """,
    "vllm/config/vllm.py": """
        class VllmConfig:
            def _set_cudagraph_sizes(self):
                max_cudagraph_capture_size = min(self.scheduler_config.max_num_seqs * 2, 512)
    """,
}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_release_table", ROOT / "scripts" / "vllm_release_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _sdist(tmp_path: Path) -> Path:
    path = tmp_path / "vllm-9.9.0.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, text in FILES.items():
            data = textwrap.dedent(text).lstrip().encode()
            info = tarfile.TarInfo(f"vllm-9.9.0/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_every_fact_is_read_from_the_source_with_its_line(tmp_path: Path) -> None:
    table = _script().table(_sdist(tmp_path))
    assert table["version"] == "9.9.0"
    assert set(table["architectures"]["names"]) == {"LlamaForCausalLM", "Glm4MoeLiteForCausalLM"}
    assert table["mla_model_types"] == {
        "values": ["deepseek_v2", "axk1"],
        "source": "vllm/transformers_utils/model_arch_config_convertor.py:3",
    }
    assert table["mtp"]["renames"]["Glm4MoeLiteForCausalLM"]["draft"] == "glm4_moe_lite_mtp"
    assert table["mtp"]["renames"]["deepseek_v3"]["source"] == "vllm/config/speculative.py:5"
    attention = table["attention"]
    assert attention["priorities"]["mla"]["10.0"] == ["CUTLASS_MLA", "TRITON_MLA"]
    assert attention["priorities"]["mla"]["8.6"] == ["TRITON_MLA"]
    cutlass = attention["backends"]["CUTLASS_MLA"]
    assert [k for k, ok in cutlass["capabilities"].items() if ok is True] == ["10.0", "10.3"]
    assert cutlass["capabilities_source"] == "vllm/v1/attention/backends/mla/cutlass_mla.py:4"  # the def line
    flashinfer = attention["backends"]["FLASHINFER"]
    assert flashinfer["capabilities"]["7.5"] is False and flashinfer["capabilities"]["12.1"] is True
    assert attention["backends"]["TRITON_MLA"]["capabilities"]["7.5"] is True  # inherited: the base returns True
    assert attention["backends"]["TRITON_MLA"]["kv_cache_dtypes"] == ["auto", "bfloat16"]
    quant = table["quantization"]
    assert quant["methods"]["fp8"]["value"] == 75 and quant["methods"]["modelopt"]["value"] == 89
    assert quant["modelopt_algos"]["ModelOptFp8Config"]["quant_algos"] == ["FP8"]
    w4a4 = quant["compressed_tensors"]["schemes"]["CompressedTensorsW4A4Fp4"]
    assert w4a4["value"] == 100 and w4a4["alternatives"] == [80, 100]  # the env-gated emulation noted
    (fallback,) = quant["compressed_tensors"]["fallbacks"]
    assert (fallback["preferred"], fallback["fallback"]) == ("CompressedTensorsW4A4Fp4", "CompressedTensorsW4A16Fp4")
    assert table["tool_parsers"]["names"] == ["glm47", "hermes"]
    assert table["reasoning_parsers"]["names"] == ["glm45"]
    assert table["gpu_memory_utilization_default"] == {"value": 0.92, "source": "vllm/config/cache.py:2"}
    assert "max_num_seqs * 2, 512" in table["cudagraph"]["capture_size_ceiling"][0]["expression"]


def test_check_mode_reports_a_table_that_differs(tmp_path: Path, capsys: object) -> None:
    script = _script()
    sdist = _sdist(tmp_path)
    out = tmp_path / "tables"
    assert script.main([str(sdist), "--out", str(out)]) == 0
    assert script.main([str(sdist), "--out", str(out), "--check"]) == 0
    written = out / "9.9.0.json"
    written.write_text(written.read_text().replace("0.92", "0.9"))
    assert script.main([str(sdist), "--out", str(out), "--check"]) == 1


def test_the_checked_in_tables_name_their_release_and_sdist() -> None:
    tables = sorted(DATA.glob("*.json"))
    assert len(tables) >= 9
    for path in tables:
        table = json.loads(path.read_text())
        assert table["version"] == path.stem
        assert table["sdist"]["file"] == f"vllm-{path.stem}.tar.gz" and len(table["sdist"]["sha256"]) == 64
        assert table["mla_model_types"]["source"].startswith("vllm/")
        assert table["attention"]["priorities"]["mla"] and table["quantization"]["methods"]
