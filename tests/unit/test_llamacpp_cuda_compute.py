"""llama.cpp's compute buffer on a local CUDA GPU, against what a CUDA build of llama-server b11434 logged
on an NVIDIA H100 80GB HBM3 (driver 580.159.04) for shape-true Llama 3 8B and 70B in Q4_K_M with zero
weights (`-fa on -np 4 --kv-unified`, ubatch 512; benchmarks/gpu_llamacpp_memory.py made the files and
ran the gateway's own plans; the other rows came from llama-server started by hand on the same files).
Before the CUDA term the plan said 328 MiB where the 70B at 131,072 with q8_0 took 720.09."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.llamacpp import facts_from_gguf
from backends.llamacpp.gguf_reader import read_gguf_header
from backends.llamacpp.placement import place
from gateway.core.devices import MIB, Device, parse_gpu_spec
from gateway.core.model_facts import ModelFacts
from tests.synthetic_gguf import LLAMA_8B, make_llama_shapes

# (model, context, KV type of K and V, -ngl) -> CUDA0 compute buffer size, MiB, as llama-server logged it
MEASURED_H100 = {
    ("8b", 32768, "f16", 33): 148.01,
    ("8b", 65536, "f16", 33): 180.01,
    ("8b", 131072, "f16", 33): 244.00,
    ("8b", 32768, "q8_0", 33): 200.09,
    ("8b", 65536, "q8_0", 33): 360.09,
    ("8b", 131072, "q8_0", 33): 680.09,
    ("8b", 131072, "q4_0", 33): 680.09,
    ("8b", 131072, "f16", 20): 680.00,
    ("8b", 131072, "f16", 10): 680.00,
    ("8b", 65536, "f16", 20): 360.00,
    ("8b", 65536, "q8_0", 20): 512.00,
    ("8b", 131072, "q8_0", 20): 968.00,
    ("70b", 32768, "f16", 81): 264.01,
    ("70b", 65536, "f16", 81): 296.01,
    ("70b", 32768, "q8_0", 81): 264.09,
    ("70b", 65536, "q8_0", 81): 400.09,
    ("70b", 131072, "q8_0", 81): 720.09,
}


@pytest.fixture(scope="module")
def llamas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelFacts]:
    folder = tmp_path_factory.mktemp("cuda-shapes")
    eight = make_llama_shapes(folder / "l8.gguf", LLAMA_8B, "llama-3-8b-q4_k_m-shapes")
    seventy = make_llama_shapes(folder / "l70.gguf")
    return {
        "8b": facts_from_gguf(read_gguf_header(eight), "llama-3-8b"),
        "70b": facts_from_gguf(read_gguf_header(seventy), "llama-3-70b"),
    }


def h100() -> tuple[Device, ...]:
    return tuple(parse_gpu_spec("1x80GiB@9.0"))


@pytest.mark.parametrize(("case", "logged_mib"), MEASURED_H100.items(), ids=lambda v: str(v))
def test_the_cuda_compute_buffer_is_what_an_h100_logged(
    llamas: dict[str, ModelFacts], case: tuple[str, int, str, int], logged_mib: float
) -> None:
    """Within 4 % (or 16 MiB) of the engine's own figure."""
    model, n_ctx, kv_type, ngl = case
    placement = place(llamas[model], h100(), n_ctx, kv_type, "native", ngl)
    planned_mib = placement.device_compute[0] / MIB
    assert abs(planned_mib - logged_mib) <= max(16.0, 0.04 * logged_mib), (planned_mib, logged_mib)


def test_a_remote_device_keeps_the_rpc_measured_buffer(llamas: dict[str, ModelFacts]) -> None:
    """The CUDA copies are a local GPU's: an RPC device's buffer (measured on ggml-rpc-server's CPU
    backend, test_llamacpp_placement) is left as it was."""
    local = place(llamas["8b"], h100(), 131072, "q8_0", "native", 33).device_compute[0]
    gpu = h100()[0]
    remote = Device(gpu.index, gpu.name, gpu.total_bytes, gpu.free_bytes, gpu.compute_capability, node="node2")
    over_rpc = place(llamas["8b"], (remote,), 131072, "q8_0", "native", 33, op_offload=False).device_compute[0]
    assert local - over_rpc > 400 * MIB


def test_the_planned_kv_and_weights_are_the_logged_ones(llamas: dict[str, ModelFacts], tmp_path: Path) -> None:
    """The same run's other terms, from the gateway's /metrics on the H100: 8B f16 at 131,072 (model
    4403.5, KV 16384.0 MiB) and 70B q8_0 at 131,072 (39939.5, 21760.0)."""
    eight = place(llamas["8b"], h100(), 131072, "f16", "native", 33)
    seventy = place(llamas["70b"], h100(), 131072, "q8_0", "native", 81)
    assert round(eight.device_model[0] / MIB, 1) == 4403.5 and eight.device_kv[0] / MIB == 16384.0
    assert round(seventy.device_model[0] / MIB, 1) == 39939.5 and seventy.device_kv[0] / MIB == 21760.0
