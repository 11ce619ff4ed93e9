"""llama.cpp's compute buffer on a local CUDA GPU, against what a CUDA build of llama-server b11434 logged
on an NVIDIA H100 80GB HBM3 (driver 580.159.04) for shape-true Llama 3 8B and 70B in Q4_K_M with zero
weights (`-fa on -np 4 --kv-unified`, ubatch 512; benchmarks/gpu_llamacpp_memory.py made the files and
ran the gateway's own plans; the other rows came from llama-server started by hand on the same files).
Before the CUDA term the plan said 328 MiB where the 70B at 131,072 with q8_0 took 720.09."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.backends.llamacpp import facts_from_gguf
from gateway.backends.llamacpp.gguf_reader import read_gguf_header
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.llamacpp.placement import GPU_MARGIN_BYTES, place
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.backends.llamacpp.placement_search import best_placement
from gateway.backends.model_facts import ModelFacts
from gateway.core.devices import MIB, Device, parse_gpu_spec
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
    placement = place(PlacementQuery(llamas[model], h100(), n_ctx, kv_type, NATIVE), ngl)
    planned_mib = placement.device_compute[0] / MIB
    assert abs(planned_mib - logged_mib) <= max(16.0, 0.04 * logged_mib), (planned_mib, logged_mib)


def test_a_remote_device_keeps_the_rpc_measured_buffer(llamas: dict[str, ModelFacts]) -> None:
    """The CUDA copies are a local GPU's: an RPC device's buffer (measured on ggml-rpc-server's CPU
    backend, test_llamacpp_placement) is left as it was."""
    local = place(PlacementQuery(llamas["8b"], h100(), 131072, "q8_0", NATIVE), 33).device_compute[0]
    gpu = h100()[0]
    remote = Device(gpu.index, gpu.name, gpu.total_bytes, gpu.free_bytes, gpu.compute_capability, node="node2")
    over_rpc = place(
        PlacementQuery(llamas["8b"], (remote,), 131072, "q8_0", NATIVE), 33, op_offload=False
    ).device_compute[0]
    assert local - over_rpc > 400 * MIB


def test_the_planned_kv_and_weights_are_the_logged_ones(llamas: dict[str, ModelFacts], tmp_path: Path) -> None:
    """The same run's other terms, from the gateway's /metrics on the H100: 8B f16 at 131,072 (model
    4403.5, KV 16384.0 MiB) and 70B q8_0 at 131,072 (39939.5, 21760.0)."""
    eight = place(PlacementQuery(llamas["8b"], h100(), 131072, "f16", NATIVE), 33)
    seventy = place(PlacementQuery(llamas["70b"], h100(), 131072, "q8_0", NATIVE), 81)
    assert round(eight.device_model[0] / MIB, 1) == 4403.5 and eight.device_kv[0] / MIB == 16384.0
    assert round(seventy.device_model[0] / MIB, 1) == 39939.5 and seventy.device_kv[0] / MIB == 21760.0


def two_local_cards() -> tuple[Device, ...]:
    return tuple(parse_gpu_spec("1x40GiB,1x20GiB"))


def test_the_split_is_aimed_with_the_cuda_copies_of_each_local_gpu(llamas: dict[str, ModelFacts]) -> None:
    """70B with a q8_0 cache at 131,072 on a 40 GiB and a 20 GiB card: 74 of 81 slots fit, the rest in
    RAM, and each card holds its copies (masks 128 + 5 hidden 80 + a layer's f16 K and V 512 + its
    q8_0 rows 272 = 992 MiB). When the split was sized with the RPC-measured 328 MiB, both the
    proportional split (0.6743, 0.3257) and the filled one (50, 24) put 24 slots on the 20 GiB card,
    19,525.6 MiB of its 19,456 usable, so the search gave up a layer (73 slots, 1,314 MiB left idle
    on the 40 GiB card)."""
    gpus = two_local_cards()
    placement, how = best_placement(PlacementQuery(llamas["70b"], gpus, 131072, "q8_0", NATIVE))
    assert how == "74 of 81 layers on GPU" and placement.n_gpu_layers == 74
    assert [compute / MIB for compute in placement.device_compute] == [992.0, 992.0]
    totals = [
        m + k + c for m, k, c in zip(placement.device_model, placement.device_kv, placement.device_compute, strict=True)
    ]
    assert all(total <= usable for total, usable in zip(totals, placement.device_usable, strict=True))
    assert placement.slot_devices.count(0) == 51 and placement.slot_devices.count(1) == 23
    proportional = place(
        PlacementQuery(llamas["70b"], gpus, 131072, "q8_0", NATIVE), 74
    )  # the first split tried fits already
    assert proportional.tensor_split == (0.6784, 0.3216) and not proportional.overflow()


def test_the_split_leaves_the_copies_out_of_a_remote_device(llamas: dict[str, ModelFacts]) -> None:
    """A local 40 GiB card beside an RPC device of the same size, 74 of 81 slots: the split leaves room
    for the copies (992 MiB) on the local card only; the remote one is sized with the buffer measured
    on ggml-rpc-server (328 MiB), as place() counts both. Before, both were sized at 328 (an even split)."""
    local = two_local_cards()[0]
    remote = Device(1, local.name, local.total_bytes, local.free_bytes, local.compute_capability, node="node2")
    placement = place(PlacementQuery(llamas["70b"], (local, remote), 131072, "q8_0", NATIVE), 74)
    assert [compute / MIB for compute in placement.device_compute] == [992.0, 328.0]
    usable = local.free_bytes - GPU_MARGIN_BYTES
    room = [usable - 992 * MIB, usable - 328 * MIB]
    assert placement.tensor_split == tuple(round(r / sum(room), 4) for r in room) == (0.4958, 0.5042)
