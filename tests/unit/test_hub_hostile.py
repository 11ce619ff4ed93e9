"""The hub and every file are someone else's input (issue 30): the real huggingface_hub client against the
local hub told to misbehave (tests/integration/tools/hostile_hub.py, a named stand-in), and hostile
GGUF headers, configs and indexes given to the CLI. Each family failed before: a blob written outside
the cache, the token sent to another port, downloads and answers read without end, and numbers that
crashed, hung or planned nonsense."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.backends.vllm.checkpoint_facts import facts_from_hub
from gateway.cli.commands import main
from gateway.core.errors import ModelError
from gateway.hub import search
from gateway.hub.fetch import download
from tests.integration.tools.hostile_hub import (
    Sent,
    endless_body,
    endless_json,
    ignores_range,
    moved_to,
    recorder,
    renamed,
    renamed_etag,
    serving,
    slow_json,
)
from tests.integration.tools.local_hub import HubRepo, LocalHub

REPO, FILE = "evil/files", "model.gguf"
BODY = bytes(range(256)) * 800  # 200 KiB: stands in for a GGUF whose bytes must arrive intact


@pytest.fixture
def evil(hub: LocalHub, monkeypatch: pytest.MonkeyPatch) -> LocalHub:
    """The local hub with one more repository: a small file and a real config.json."""
    files = {FILE: {"raw": BODY}, "config.json": {"path": "configs/Qwen3-8B.json"}}
    monkeypatch.setitem(hub.repos, REPO, HubRepo({"id": REPO, "tags": ["gguf"], "files": files}, {}))
    return hub


def _resolve(name: str = FILE, repo: str = REPO) -> str:
    return f"/{repo}/resolve/main/{name}"


def _files_outside(root: Path, cache: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_relative_to(cache)]


def test_an_etag_that_leads_out_of_the_cache_writes_nothing_outside_it(
    evil: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(evil.hostile, _resolve(), renamed_etag(evil, "../../../../outside"))
    with pytest.raises(ModelError, match="is not a plain name: refused"):
        download(REPO, (FILE,), len(BODY))
    assert _files_outside(tmp_path, tmp_path / "hf" / "hub") == []  # before: tmp_path/outside, the hub's bytes


def test_a_commit_that_leads_out_of_the_cache_writes_nothing_outside_it(
    evil: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(evil.hostile, _resolve(), renamed(evil, "x-repo-commit", "../../../../../outside"))
    with pytest.raises(ModelError, match="is not a commit hash: refused"):
        download(REPO, (FILE,), len(BODY))
    assert _files_outside(tmp_path, tmp_path / "hf" / "hub") == []  # before: a raw ValueError, "a bug"


def test_a_redirect_to_another_origin_is_followed_without_the_token(
    evil: LocalHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_not_for_other_hosts")
    other = Sent()
    with serving(recorder(other, BODY)) as elsewhere:
        monkeypatch.setitem(evil.hostile, _resolve(), moved_to(evil, f"{elsewhere}/blob/{FILE}"))
        path = download(REPO, (FILE,), len(BODY))
    assert path.read_bytes() == BODY  # the redirect is followed: a CDN serves real files this way
    assert other.headers, "the other origin was never asked"
    assert [h.get("authorization") for h in other.headers] == [None] * len(other.headers)


def test_a_download_that_never_ends_stops_at_its_declared_size_and_is_deleted(
    evil: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Sent()
    monkeypatch.setitem(evil.hostile, _resolve(), endless_body(evil, sent, limit=64 << 20))
    started = time.monotonic()
    with pytest.raises(ModelError, match="refused"):
        download(REPO, (FILE,), len(BODY))
    assert time.monotonic() - started < 10
    left = [p for p in (tmp_path / "hf" / "hub").rglob("*") if p.is_file() and p.stat().st_size]
    assert left == []  # before: a 64 MiB .gateway-partial, resumed (as if good) next time
    assert sent.bytes < 32 << 20  # cut off, not read to the server's end


@pytest.mark.parametrize("status", [200, 206], ids=["200, Range ignored", "206 with an endless body"])
def test_a_header_read_whose_server_ignores_range_is_cut_at_the_bytes_asked(
    evil: LocalHub, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    from gateway.backends.llamacpp.remote_gguf import read_header

    sent = Sent()
    monkeypatch.setitem(evil.hostile, _resolve(), ignores_range(evil, sent, limit=256 << 20, status=status))
    with pytest.raises(ModelError, match="runs past the .* bytes asked for: refused"):
        read_header(REPO, (FILE,), (len(BODY),))
    assert sent.bytes < 32 << 20  # before: all 256 MiB held in memory


@pytest.mark.parametrize("route", ["/api/models/evil/endless", "/api/models"])
def test_an_endless_model_info_or_listing_is_cut_off(
    hub: LocalHub, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """Model info (the named model's) refuses with one line; an endless listing (a search for its
    quantizations) leaves that search out; neither is read past the cap."""
    sent = Sent()
    monkeypatch.setitem(hub.hostile, route, endless_json(sent, limit=256 << 20))
    if route.endswith("endless"):
        with pytest.raises(ModelError, match="runs past the 64 MiB cap on a hub answer: refused"):
            search.search("evil/endless")
    else:
        assert search.search("Qwen/Qwen3-8B").repositories == {}  # the named model found, its listings cut off
    asked = sum(1 for _, path, _ in hub.requests if path == route)
    assert 0 < sent.bytes < asked * (96 << 20)  # each answer cut near its 64 MiB; before: all 256 MiB of each


def test_an_answer_that_trickles_forever_is_cut_at_its_deadline(hub: LocalHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A few bytes every 0.05 s never trips a read timeout; the deadline (here 0.5 s plus the cap at the
    minimum rate, said rounded: 1 s) ends it."""
    from gateway.hub import guard

    monkeypatch.setattr(guard, "BASE_SECONDS", 0.5)
    monkeypatch.setattr(guard, "DEFAULT_BYTES", 1024)
    sent = Sent()
    monkeypatch.setitem(hub.hostile, "/api/models/evil/slow", slow_json(sent, every_s=0.05))
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"bytes in more than 1 s: refused"):
        search.search("evil/slow")
    assert time.monotonic() - started < 3


def test_every_module_that_asks_the_hub_installs_the_guard() -> None:
    """By construction: a module calling huggingface_hub's network functions calls guard_hub() too."""
    network = ("hf_hub_download", "HfApi", "HfFileSystem", "get_hf_file_metadata", "get_safetensors_metadata")
    root = Path(__file__).resolve().parents[2]
    unguarded = [
        str(path.relative_to(root))
        for top in ("gateway",)
        for path in (root / top).rglob("*.py")
        if any(f"{name}(" in (text := path.read_text()) for name in network) and "guard_hub()" not in text
    ]
    assert unguarded == []


def test_listed_names_that_lead_out_of_the_cache_are_not_planned_from(
    hub: LocalHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = {"../../escape.gguf": {"text": "x"}, "/abs.gguf": {"text": "x"}, "ok-Q4_K_M.gguf": {"text": "x"}}
    monkeypatch.setitem(hub.repos, "evil/names", HubRepo({"id": "evil/names", "files": names}, {}))
    found = search.Search("evil/names")
    assert search.files(found, "evil/names") == [("ok-Q4_K_M.gguf", 1)]


# -- numbers and JSON from files: one line naming the file, the field and the value -------------------
_KINDS = {int: (11, "<q"), float: (12, "<d"), str: (8, None)}


def _gguf(path: Path, metadata: dict[str, Any]) -> Path:
    """A GGUF header with these keys and no tensors (the reader needs nothing more)."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata)))
    for key, value in metadata.items():
        kind, fmt = _KINDS[type(value)]
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind)
        out += struct.pack("<Q", len(value)) + value.encode() if fmt is None else struct.pack(fmt, value)
    path.write_bytes(bytes(out) + b"\0" * 64)
    return path


_LLAMA = {
    "general.architecture": "llama", "llama.block_count": 4, "llama.context_length": 4096,
    "llama.embedding_length": 256, "llama.attention.head_count": 4,
}  # fmt: skip
HOSTILE_GGUF = {
    "block_count -5": ({"llama.block_count": -5}, "llama.block_count = -5"),
    "block_count 1e30": ({"llama.block_count": 1e30}, "llama.block_count = 1e+30"),
    "block_count 10^8": ({"llama.block_count": 10**8}, "llama.block_count = 100000000"),
    "context_length -4096": ({"llama.context_length": -4096}, "llama.context_length = -4096"),
    "embedding_length 0": ({"llama.embedding_length": 0}, "llama.embedding_length = 0"),
    "general.alignment 0": ({"general.alignment": 0}, "general.alignment = 0"),
}


def _one_line(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], float]:
    started = time.monotonic()
    code = main(list(argv))
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert "Traceback" not in err and "a bug" not in err, err
    return code, [line for line in err.splitlines() if line.startswith("gateway: error:")], took


@pytest.mark.parametrize("case", list(HOSTILE_GGUF))
def test_a_hostile_number_in_a_gguf_header_is_one_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changes, said = HOSTILE_GGUF[case]
    path = _gguf(tmp_path / "hostile.gguf", _LLAMA | changes)
    code, errors, took = _one_line(capsys, "plan", "--model", str(path), "--gpus", "1x24GiB")
    assert code == 1 and len(errors) == 1 and took < 10, errors
    assert str(path) in errors[0] and said in errors[0], errors


_QWEN = json.loads((Path(__file__).parents[1] / "data" / "hub" / "configs" / "Qwen3-8B.json").read_text())


def _nested(depth: int) -> str:
    return '{"hidden_size": 1, "a": ' + "[" * depth + "]" * depth + "}"


HOSTILE_CONFIG = {
    "num_hidden_layers 10^9": (json.dumps(_QWEN | {"num_hidden_layers": 10**9}), "num_hidden_layers = 1000000000"),
    "num_attention_heads 0": (json.dumps(_QWEN | {"num_attention_heads": 0}), "num_attention_heads = 0"),
    "hidden_size 0": (json.dumps(_QWEN | {"hidden_size": 0}), "hidden_size = 0"),
    "max_position_embeddings -4096": (
        json.dumps(_QWEN | {"max_position_embeddings": -4096}),
        "max_position_embeddings = -4096",
    ),
    "a list": ("[1, 2, 3]", "a JSON list where an object belongs"),
    "nested 100,000 deep": (_nested(100_000), "nested deeper than Python can parse"),
}


@pytest.mark.parametrize("case", list(HOSTILE_CONFIG))
def test_a_hostile_config_json_is_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, said = HOSTILE_CONFIG[case]
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(text)
    code, errors, took = _one_line(capsys, "plan", "--model", str(tmp_path / "ckpt"), "--gpus", "1x24GiB")
    assert code == 1 and len(errors) == 1 and took < 10, errors
    assert "config.json" in errors[0] and said in errors[0], errors


@pytest.mark.parametrize(
    "index",
    [
        {"model.safetensors.index.json": {"text": json.dumps({"metadata": {}, "weight_map": {}})}},
        {"model.safetensors": {"raw": struct.pack("<Q", 40) + b"{not json" + b" " * 31}},
    ],
    ids=["an index listing no files", "a header that does not parse"],
)
def test_an_index_without_weights_is_estimated_from_config_json_and_said(
    hub: LocalHub, monkeypatch: pytest.MonkeyPatch, index: dict[str, Any]
) -> None:
    files = {"config.json": {"path": "configs/Qwen3-8B.json"}, **index}
    monkeypatch.setitem(hub.repos, "evil/no-weights", HubRepo({"id": "evil/no-weights", "files": files}, {}))
    facts = facts_from_hub("evil/no-weights")
    assert 15e9 < facts.weight_bytes < 18e9  # Qwen3-8B in bf16, not 0.00 GiB (a 250k-token plan)
    assert facts.weight_bytes_source == "estimated from the architecture"
    assert any("safetensors index or headers were not usable" in note for note in facts.notes), facts.notes


def test_a_local_shard_whose_header_claims_exabytes_is_estimated_and_said(tmp_path: Path) -> None:
    from gateway.backends.vllm.checkpoint_facts import facts_from_dir

    (tmp_path / "config.json").write_text(json.dumps(_QWEN))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    facts = facts_from_dir(tmp_path, "local")  # before: MemoryError or OverflowError reading 2^60 bytes
    assert 15e9 < facts.weight_bytes < 18e9 and facts.weight_bytes_source == "estimated from the architecture"
    assert any("safetensors header of 1,152,921,504,606,846,976 bytes" in note for note in facts.notes), facts.notes


# -- names and counts from the command line ---------------------------------------------------------------
def test_a_5000_character_repo_id_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, errors, took = _one_line(capsys, "plan", "--model", "org/" + "x" * 5000, "--gpus", "1x24GiB")
    assert code == 1 and len(errors) == 1 and took < 5, errors
    assert "is not a hub repository id" in errors[0] and len(errors[0]) < 300, errors


def test_a_hundred_thousand_gpus_is_one_line_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    code, errors, took = _one_line(capsys, "plan", "--model", "glm-4.7-flash", "--gpus", "100000x24GiB")
    assert code == 1 and len(errors) == 1 and took < 5 and "more than 64 GPUs" in errors[0], errors


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    yield tmp_path


def test_a_file_in_the_current_directory_named_like_the_hub_gguf_is_not_served(elsewhere: Path) -> None:
    from gateway.backends import llamacpp
    from gateway.cli.full_settings import Settings
    from gateway.core.devices import GIB, Inventory, parse_gpu_spec
    from gateway.planning.serve_plan import plan_serving

    source = llamacpp.LlamaCppSource(gguf_repo="unsloth/GLM-4.7-Flash-GGUF", gguf_file="GLM-4.7-Flash-Q4_K_M.gguf")
    planted = elsewhere / source.gguf_repo / source.gguf_file  # type: ignore[operator]
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"not the hub's file")
    (elsewhere / "GLM-4.7-Flash-Q4_K_M.gguf").write_bytes(b"nor this")
    settings = Settings(
        state_dir=elsewhere / "state", model="glm-4.7-flash", llama_launcher="python",
        llama_cpp_python_command=["py", "-m", "llama_cpp.server"],
    )  # fmt: skip
    machine = Inventory(parse_gpu_spec("1x24GiB@8.9"), 64 * GIB, 64 * GIB, source="simulated")
    option = plan_serving(settings, machine=machine).options[-1]
    assert isinstance(option, llamacpp.LlamaCppOption)
    assert option.fetch is not None  # fetched from the hub cache when tried; before: the planted file, served
