"""How vLLM runs a pre-quantized checkpoint's matrix products on a GPU: with the format's own
tensor-core kernels, or, below the capability those are built for, as Marlin weight-only kernels that
dequantize to 16 bits in registers (W8A16 for FP8, W4A16 for NVFP4). The checkpoint loads either way
(``get_min_capability`` 75, gateway/backends/vllm/release_table.py); what changes is the speed and what the
rung should say.

As read in vLLM 0.32.0's sdist (the thresholds sit in its CUDA sources, which the release tables do
not read, so they are written down here with their lines):

- FP8: ``CutlassFP8ScaledMMLinearKernel.is_supported`` asks ``cutlass_scaled_mm_supports_fp8``:
  capability 8.9+ (csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu:145; the torch ``_scaled_mm``
  kernels need 8.9 too); below it ``MarlinFP8ScaledMMLinearKernel`` (7.5+,
  vllm/model_executor/kernels/linear/scaled_mm/marlin.py:35), and MoE experts run Marlin likewise.
- NVFP4: ``cutlass_fp4_supported`` asks ``cutlass_scaled_mm_supports_fp4``: 10.x–11.x and 12.x
  (csrc/quantization/fp4/nvfp4_scaled_mm_entry.cu:71); below it FP4 Marlin (7.5+,
  vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py:33), MoE experts through
  ``MarlinExperts`` (vllm/model_executor/layers/fused_moe/oracle/nvfp4.py:134).

The speed price: one request's decode reads the same bytes either way, but Marlin spends part of the
time dequantizing, the more so for its MoE kernels; :data:`DECODE_SHARE` is the share of the native
kernels' decode speed assumed for it (an estimate, not measured on these GPUs: Marlin's own
figures put dense 4-bit decode near its bandwidth bound, FP8 Marlin lower). Prompt processing runs at
16-bit tensor-core rate instead of FP8/FP4, which the decode figure does not show.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.vllm.checkpoint_facts import CheckpointFacts

MARLIN_FP8 = "vllm/model_executor/kernels/linear/scaled_mm/marlin.py:35"
MARLIN_FP4 = "vllm/model_executor/layers/quantization/utils/marlin_utils_fp4.py:33"
NATIVE_FP8 = "csrc/quantization/w8a8/cutlass/scaled_mm_entry.cu:145"
NATIVE_FP4 = "csrc/quantization/fp4/nvfp4_scaled_mm_entry.cu:71"
# share of the native kernels' one-request decode speed a Marlin weight-only kernel is assumed to reach
DECODE_SHARE = {"W8A16": 0.8, "W4A16": 0.9}


@dataclass(frozen=True)
class WeightOnly:
    """A quantized checkpoint run by Marlin weight-only kernels on this GPU."""

    scheme: str  # "W8A16" | "W4A16"
    quantization: str  # the checkpoint's format: "fp8" | "nvfp4"
    native_from: str  # the capability its own kernels need, e.g. "8.9"
    source: str  # vLLM's line for the Marlin path, and the CUDA source of the native threshold

    @property
    def phrase(self) -> str:
        """What the rung says: "FP8 runs as W8A16 Marlin here (native FP8 needs 8.9+; ...)"."""
        return (
            f"{self.quantization.upper()} runs as {self.scheme} Marlin weight-only kernels here "
            f"(native {self.quantization.upper()} needs compute capability {self.native_from}+; {self.source})"
        )

    @property
    def decode_share(self) -> float:
        return DECODE_SHARE[self.scheme]


def native_fp8(capability: tuple[int, int]) -> bool:
    return capability >= (8, 9)


def native_fp4(capability: tuple[int, int]) -> bool:
    return (10, 0) <= capability < (13, 0)


def weight_only(facts: CheckpointFacts, capability: tuple[int, int]) -> WeightOnly | None:
    """The Marlin path vLLM takes for this checkpoint on this capability, or None where its own
    kernels run (or it is not FP8/NVFP4, or the GPU is unknown)."""
    if capability == (0, 0):
        return None
    if facts.quantization == "fp8" and not native_fp8(capability):
        return WeightOnly("W8A16", "fp8", "8.9", f"{MARLIN_FP8}, {NATIVE_FP8}")
    if facts.quantization == "nvfp4" and not native_fp4(capability):
        return WeightOnly("W4A16", "nvfp4", "10.0", f"{MARLIN_FP4}, {NATIVE_FP4}")
    return None


def decode_share(facts: CheckpointFacts, capability: tuple[int, int]) -> float:
    """What a decode speed estimate of the native kernels is multiplied by on this GPU: 1.0 where
    they run, :data:`DECODE_SHARE` of the scheme where Marlin does."""
    found = weight_only(facts, capability)
    return found.decode_share if found else 1.0
