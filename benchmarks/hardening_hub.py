"""The hub families of the hardening figures (issue 30): the gateway's hub code (of this tree, or of
``--source DIR``) run in its own process against a malicious local hub
(tests/integration/tools/hostile_hub.py), and hostile files given to ``gateway plan``.

    python benchmarks/hardening.py hub                  # every hub family, this tree (about a minute)
    python benchmarks/hardening.py hub --source DIR     # another checkout (`git archive` of an older commit)

Per case: the exit status, the seconds, the process's peak RSS, its last line, and what the family is
about: files written outside the hub cache (etag), whether the token reached the other origin
(redirect), the bytes the hostile server sent and what was left in the cache (endless, range, info).
A case still running after ``TIMEOUT`` seconds is killed and reported so.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.tools import hostile_hub  # noqa: E402
from tests.integration.tools.local_hub import HubRepo, running  # noqa: E402

MB = 1 << 20
TIMEOUT = 90.0
REPO, FILE = "evil/files", "model.gguf"
BODY = bytes(range(256)) * 800
SENT_LIMIT = 512 * MB  # what each "endless" answer sends at most (the old tree reads all of it)

_RUN = """
import sys
try:
    {call}
    print("ok")
except BaseException as exc:
    print("refused:", type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
    sys.exit(1)
"""
DOWNLOAD = f"from gateway.hub.fetch import download; download({REPO!r}, ({FILE!r},), {len(BODY)})"
HEADER = f"from backends.llamacpp.remote_gguf import read_header; read_header({REPO!r}, ({FILE!r},), ({len(BODY)},))"
SEARCH = "from gateway.hub.search import search; search('evil/endless')"


def _peak_run(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Run ``argv``; its exit status, seconds, peak RSS (MB) and last line."""
    started = time.monotonic()
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watched, peak = psutil.Process(process.pid), 0.0
    while process.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, watched.memory_info().rss / MB)
        if time.monotonic() - started > TIMEOUT:
            process.kill()
            break
        time.sleep(0.02)
    out = process.communicate()[0].decode(errors="replace").strip().splitlines()
    seconds = time.monotonic() - started
    return {
        "exit": process.returncode if seconds <= TIMEOUT else f"killed after {TIMEOUT:.0f} s",
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(peak, 1),
        "said": (out[-1] if out else "")[:220],
    }


def _gguf(path: Path, changes: dict[str, Any]) -> Path:
    kinds = {int: (11, "<q"), float: (12, "<d"), str: (8, None)}
    keys = {
        "general.architecture": "llama", "llama.block_count": 4, "llama.context_length": 4096,
        "llama.embedding_length": 256, "llama.attention.head_count": 4,
    } | changes  # fmt: skip
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(keys)))
    for key, value in keys.items():
        kind, fmt = kinds[type(value)]
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind)
        out += struct.pack("<Q", len(value)) + value.encode() if fmt is None else struct.pack(fmt, value)
    path.write_bytes(bytes(out) + b"\0" * 64)
    return path


def _config_dir(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "config.json").write_text(text)
    return path


def hub_families(source: Path) -> dict[str, Any]:
    """Every hub family against ``source``'s code; the figures per case."""
    results: dict[str, Any] = {}
    qwen = json.loads((ROOT / "tests" / "data" / "hub" / "configs" / "Qwen3-8B.json").read_text())
    with running() as (url, hub), tempfile.TemporaryDirectory(prefix="hardening-hub-") as scratch:
        hub.repos[REPO] = HubRepo({"id": REPO, "tags": ["gguf"], "files": {FILE: {"raw": BODY}}}, {})
        work = Path(scratch)

        def case(name: str, argv: list[str], prepare: Callable[[], Any] | None = None) -> dict[str, Any]:
            home = work / name / "hf"
            home.mkdir(parents=True)
            env = {
                **os.environ, "PYTHONPATH": str(source), "HF_ENDPOINT": url, "HF_HOME": str(home),
                "HF_TOKEN": "hf_benchmark_secret", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            }  # fmt: skip
            hub.hostile.clear()
            extra = prepare() if prepare else None
            found = _peak_run([sys.executable, *argv], env, work / name)
            cache = home / "hub"
            found["outside_cache"] = [
                str(p.relative_to(work / name))
                for p in (work / name).rglob("*")
                if p.is_file() and not p.is_relative_to(home)
            ]
            found["left_in_cache_mb"] = round(
                sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and ".gateway-partial" in p.name) / MB, 1
            )
            if isinstance(extra, hostile_hub.Sent):
                found["hub_sent_mb"] = round(extra.bytes / MB, 1)
            print(name, json.dumps(found), file=sys.stderr, flush=True)
            return found

        resolve = f"/{REPO}/resolve/main/{FILE}"
        results["etag ../../../../outside"] = case(
            "etag", ["-c", _RUN.format(call=DOWNLOAD)],
            lambda: hub.hostile.__setitem__(resolve, hostile_hub.renamed_etag(hub, "../../../../outside")),
        )  # fmt: skip
        other = hostile_hub.Sent()
        with hostile_hub.serving(hostile_hub.recorder(other, BODY)) as elsewhere:
            found = case(
                "redirect", ["-c", _RUN.format(call=DOWNLOAD)],
                lambda: hub.hostile.__setitem__(resolve, hostile_hub.moved_to(hub, f"{elsewhere}/blob")),
            )  # fmt: skip
        found["token_sent_to_other_port"] = any("authorization" in h for h in other.headers)
        results["redirect to another port"] = found

        def endless(answer: Callable[..., Any], path: str = resolve) -> Callable[[], hostile_hub.Sent]:
            def prepare() -> hostile_hub.Sent:
                sent = hostile_hub.Sent()
                hub.hostile[path] = answer(sent)
                return sent

            return prepare

        results["download of 200 KiB that never ends"] = case(
            "endless", ["-c", _RUN.format(call=DOWNLOAD)],
            endless(lambda sent: hostile_hub.endless_body(hub, sent, SENT_LIMIT)),
        )  # fmt: skip
        results["header read, Range ignored"] = case(
            "range", ["-c", _RUN.format(call=HEADER)],
            endless(lambda sent: hostile_hub.ignores_range(hub, sent, SENT_LIMIT)),
        )  # fmt: skip
        results["model info that never ends"] = case(
            "info", ["-c", _RUN.format(call=SEARCH)],
            endless(lambda sent: hostile_hub.endless_json(sent, SENT_LIMIT), "/api/models/evil/endless"),
        )  # fmt: skip
        plan = ["-m", "gateway", "plan", "--gpus", "1x24GiB", "--model"]
        ggufs = {
            "block_count 10^7": {"llama.block_count": 10**7},
            "block_count -5": {"llama.block_count": -5},
            "block_count 1e30": {"llama.block_count": 1e30},
            "general.alignment 0": {"general.alignment": 0},
            "context_length -4096": {"llama.context_length": -4096},
        }
        for label, changes in ggufs.items():
            name = "gguf-" + label.replace(" ", "_").replace("^", "")
            (work / name).mkdir()
            path = _gguf(work / name / "hostile.gguf", changes)
            results[f"GGUF {label}"] = case(name + "-run", [*plan, str(path)])
        configs = {
            "num_hidden_layers 10^9": json.dumps(qwen | {"num_hidden_layers": 10**9}),
            "num_attention_heads 0": json.dumps(qwen | {"num_attention_heads": 0}),
            "hidden_size 0": json.dumps(qwen | {"hidden_size": 0}),
            "a list": "[1, 2, 3]",
            "nested 100,000 deep": '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
        }
        for label, text in configs.items():
            name = "config-" + label.replace(" ", "_").replace("^", "").replace(",", "")
            (work / name).mkdir()
            directory = _config_dir(work / name / "ckpt", text)
            results[f"config.json {label}"] = case(name + "-run", [*plan, str(directory)])
        results["a 5,000-character repo id"] = case("long-id", [*plan, "org/" + "x" * 5000])
        results["--gpus 100000x24GiB"] = case(
            "gpus", ["-m", "gateway", "plan", "--model", "glm-4.7-flash", "--gpus", "100000x24GiB"]
        )
    return results
