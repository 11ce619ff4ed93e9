"""The remembered configurations (known-good.json) are input that may have gone bad: a file that is not
a JSON object is renamed aside, an entry of the wrong shape or one that no longer resolves (its hub repo
gone) is moved to known-good.set-aside.json; each with a warning that names --replan, and the plan is
made afresh instead of stopping with "nothing fits" or a bug message. Nothing is deleted."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.full_settings import Settings
from gateway.core.devices import GIB, Inventory
from gateway.core.files import exclusive
from gateway.planning.catalog import builtin_catalog
from gateway.planning.from_settings import plan_for
from gateway.planning.serve_plan import plan_serving
from gateway.remembered import known_good
from gateway.remembered.known_good import FILE_NAME, SET_ASIDE_NAME, KnownGood
from tests.extras import needs_embedded_model
from tests.integration.tools.local_hub import LocalHub

CPU = Inventory((), 24 * GIB, 20 * GIB, source="none")
GOOD = {"engine": "llamacpp", "version": "1", "memo": {"gguf": "/m.gguf"}, "when": "2026-11-01T00:00:00Z"}


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "--replan" in r.getMessage()]


@pytest.mark.parametrize("text", ['{"m|fp": {"engine": ', "[1, 2]", "\x00\x01garbage", "[" * 100_000])
def test_a_file_that_is_not_a_json_object_is_renamed_aside(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / FILE_NAME).write_text(text)
    store = KnownGood(tmp_path)
    assert store.get("m", "fp") is None
    (aside,) = tmp_path.glob(f"{FILE_NAME}.bad-*")
    assert aside.read_text() == text and not (tmp_path / FILE_NAME).exists()
    assert len(_warned(caplog)) == 1 and aside.name in _warned(caplog)[0]
    store.put("m", "fp", "llamacpp", "1", {"gguf": "/m.gguf"})  # and what works next is remembered again
    assert store.get("m", "fp") is not None


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({"memo": "x"}, "memo"),
        ({"engine": 5}, "engine"),
        ({"version": None}, "version"),
        ({"measured": "fast"}, "measured"),
        ({"measured": {"decode_tokens_per_s": "fast"}}, "measured.decode_tokens_per_s"),
        ({"measured": {"decode_tokens_per_s": -3.0}}, "measured.decode_tokens_per_s"),
    ],
)
def test_an_entry_of_the_wrong_shape_is_set_aside_and_the_others_kept(
    tmp_path: Path, bad: dict[str, Any], said: str, caplog: pytest.LogCaptureFixture
) -> None:
    other = {**GOOD, "memo": {"gguf": "/other.gguf"}}
    (tmp_path / FILE_NAME).write_text(json.dumps({"m|fp": {**GOOD, **bad}, "n|fp": other}))
    store = KnownGood(tmp_path)
    assert store.get("m", "fp") is None
    assert store.get("n", "fp") == other
    (entry,) = json.loads((tmp_path / SET_ASIDE_NAME).read_text()).values()
    assert entry["entry"] == {**GOOD, **bad} and said in entry["why"]
    assert "m|fp" not in json.loads((tmp_path / FILE_NAME).read_text())
    (warning,) = _warned(caplog)
    assert "set aside" in warning and said in warning


def test_measured_figures_come_back_as_numbers(tmp_path: Path) -> None:
    """A hand-edited figure written as a string is read as the number the plan divides by."""
    entry = {**GOOD, "measured": {"decode_tokens_per_s": "12.5", "estimated_decode_tokens_per_s": 10}}
    (tmp_path / FILE_NAME).write_text(json.dumps({"m|fp": entry}))
    read = KnownGood(tmp_path).get("m", "fp")
    assert read is not None and read["measured"] == {"decode_tokens_per_s": 12.5, "estimated_decode_tokens_per_s": 10.0}


@needs_embedded_model
@pytest.mark.parametrize(
    "bad",
    [
        {"measured": {"decode_tokens_per_s": "x", "estimated_decode_tokens_per_s": 2}},  # a bug message before
        {"measured": "x"},
        {"memo": {"gguf": 5}},  # only rebuilding the option reads the memo of a local model
    ],
    ids=["measured-figure", "measured", "memo"],
)
def test_plan_and_serve_plan_afresh_past_a_malformed_entry(
    tmp_path: Path, bad: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(state_dir=tmp_path, model="gemma-3-270m", llama_launcher="python",
                        llama_cpp_python_command=["py", "-m", "llama_cpp.server"])  # type: ignore[arg-type]  # fmt: skip
    fresh = plan_serving(settings, machine=CPU)
    remember, option = fresh.remember, fresh.options[0]
    remember.store.put(remember.model, remember.fingerprint, option.engine, remember.versions[option.engine],
                       option.memo())  # fmt: skip
    path = tmp_path / FILE_NAME
    data = json.loads(path.read_text())
    (key,) = data
    data[key] |= bad
    path.write_text(json.dumps(data))
    entry = builtin_catalog().resolve("gemma-3-270m")
    assert plan_for(settings, entry, CPU, serving=False).chosen is not None
    path.write_text(json.dumps(data))  # `plan` set it aside; `serve` meets it too
    again = plan_serving(settings, machine=CPU)
    assert again.options[0].launch(1234, "k").argv == option.launch(1234, "k").argv
    assert _warned(caplog) and (tmp_path / SET_ASIDE_NAME).exists()


@pytest.mark.parametrize(
    ("variant", "why"),
    [({"repo": "gone-publisher/Qwen3-8B-GGUF"}, "no longer planned"), ({"repo": 5, "files": 5}, "unreadable")],
    ids=["repo-gone", "wrong-types"],
)
def test_a_remembered_quantization_that_no_longer_resolves_is_set_aside(
    hub: LocalHub, tmp_path: Path, caplog: pytest.LogCaptureFixture, variant: dict[str, Any], why: str
) -> None:
    settings = Settings(state_dir=tmp_path, model="Qwen/Qwen3-8B", llama_launcher="native",
                        llama_server_command=["llama-server"], vllm_version="0.32.0")  # type: ignore[arg-type]  # fmt: skip
    machine = Inventory((), 64 * GIB, 64 * GIB, source="simulated")
    fresh = plan_serving(settings, machine=machine)
    remember, option = fresh.remember, fresh.options[0]
    memo = option.memo()
    stale = {**memo["hub_variant"], **variant}
    remember.store.put(remember.model, remember.fingerprint, option.engine, remember.versions[option.engine],
                       {**memo, "hub_variant": stale})  # fmt: skip
    again = plan_serving(settings, machine=machine)  # before: "nothing fits" (repo gone) or a TypeError
    assert again.options[0].memo()["hub_variant"] == memo["hub_variant"]  # the hub searched again
    (entry,) = json.loads((tmp_path / SET_ASIDE_NAME).read_text()).values()
    assert entry["entry"]["memo"]["hub_variant"] == stale and why in entry["why"]
    assert len(_warned(caplog)) == 1 and KnownGood(tmp_path).get(remember.model, remember.fingerprint) is None


def test_a_set_aside_file_that_went_bad_is_renamed_aside_too(tmp_path: Path) -> None:
    (tmp_path / SET_ASIDE_NAME).write_text("not json")
    (tmp_path / FILE_NAME).write_text(json.dumps({"m|fp": {**GOOD, "memo": "x"}}))
    assert KnownGood(tmp_path).get("m", "fp") is None
    (old,) = tmp_path.glob(f"{SET_ASIDE_NAME}.bad-*")
    assert old.read_text() == "not json" and len(json.loads((tmp_path / SET_ASIDE_NAME).read_text())) == 1


# -- issue 47, item 7: every gateway of the machine shares the file ----------------------------------------
RECORDER = """
import sys, time
from pathlib import Path
from gateway.remembered import known_good
state, name, count, write_s = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
written = known_good.replace_atomically
def slow_disk(*args, **kwargs):  # a write that takes write_s (a busy disk's fsync)
    time.sleep(write_s)
    written(*args, **kwargs)
known_good.replace_atomically = slow_disk
store = known_good.KnownGood(state)
print("ready", flush=True)
sys.stdin.read()  # the driver closes every recorder's stdin at once, when all are ready: all start together
for n in range(count):
    store.put(f"{name}-{n}", "fp", "llamacpp", "1", {"gguf": f"/{name}-{n}.gguf"})
"""


def record_at_once(state_dir: Path, processes: int, each: int, write_s: float = 0.0, root: Path | None = None) -> int:
    """``processes`` real processes (the gateway code of ``root``, default this tree's) record ``each``
    configurations into one store at once, each write taking at least ``write_s``: how many the file
    holds after (benchmarks/hardening_47_edge.py reports it too)."""
    root = root or Path(__file__).resolve().parents[2]
    recorders = [
        subprocess.Popen(
            [sys.executable, "-c", RECORDER, str(state_dir), f"gateway{n}", str(each), str(write_s)],
            env={**os.environ, "PYTHONPATH": str(root)},
            cwd=root,  # ``-c`` puts the working folder first on the path: its gateway would be the one run
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for n in range(processes)
    ]
    # a barrier, not a fixed start time: each says "ready" once its imports are done (or ends: EOF)
    assert [recorder.stdout.readline() for recorder in recorders if recorder.stdout] == [b"ready\n"] * processes
    for recorder in recorders:
        if recorder.stdin:
            recorder.stdin.close()
    assert [recorder.wait(timeout=120) for recorder in recorders] == [0] * processes
    for recorder in recorders:
        if recorder.stdout:
            recorder.stdout.close()
    return len(json.loads((state_dir / FILE_NAME).read_text()))


@pytest.mark.timeout(120)
def test_two_processes_recording_at_once_keep_every_record(tmp_path: Path) -> None:
    """Two gateways recording at once each read the file, added theirs and wrote it back: one record was
    lost. Unlocked, 30 + 30 records at once kept 30 to 36 of the 60 here; with each write taking 20 ms,
    as on a busy disk (how the writes fall no longer decides it), 30 of 60 every time (10 of the 20 here)."""
    assert record_at_once(tmp_path, processes=2, each=10, write_s=0.02) == 20


def test_a_store_held_too_long_by_another_is_an_error_for_a_write_and_nothing_for_a_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stuck holder costs a warning (and the plan made afresh), not a start-up that waits for ever."""
    monkeypatch.setattr(known_good, "LOCK_WAIT_S", 0.05)  # waited out twice: the holder never lets go
    store = KnownGood(tmp_path)
    store.put("m", "fp", "llamacpp", "1", {"gguf": "/m.gguf"})
    with exclusive(store.lock_path):  # another holder (a lock of its own on the file, as another process's)
        with pytest.raises(OSError, match="held by another process for over 0.05 s"):
            store.put("m2", "fp", "llamacpp", "1", {"gguf": "/m2.gguf"})
        assert store.get("m", "fp") is None
    assert any("cannot read the remembered configurations" in r.getMessage() for r in caplog.records)
    assert store.get("m", "fp") is not None and store.get("m2", "fp") is None
