"""What each engine is asked to do for many sessions at once: vLLM started with priority scheduling and a
cap per long prompt, llama-server's long prefill in its last slot, and the plan's sessions line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.backends import llamacpp
from gateway.backends.llamacpp.launcher import NATIVE
from gateway.backends.llamacpp.scheduling import CPU_BATCH, PRIME, batch
from gateway.backends.llamacpp.scheduling import scheduling as llama_scheduling
from gateway.backends.vllm import report
from gateway.backends.vllm.argv import build_argv
from gateway.backends.vllm.checkpoint_facts import checkpoint_facts
from gateway.backends.vllm.ladder import cpu_candidate
from gateway.backends.vllm.memory import Checkpoint, VllmFlags
from gateway.backends.vllm.scheduling import long_prefill_threshold, step_phrase
from gateway.backends.vllm.scheduling import scheduling as vllm_scheduling
from gateway.cli.commands import main
from gateway.core.devices import GIB
from gateway.core.policy import Goal, Policy
from tests.extras import needs_native_llama_server

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_runs_warm_turns_first_and_caps_what_a_long_prompt_takes_of_a_step() -> None:
    facts = checkpoint_facts(json.loads((CONFIGS / "Qwen2.5-3B.json").read_text()), "Qwen2.5-3B")
    flags = cpu_candidate(Checkpoint(facts.name, facts), 16 * GIB, "0.32.0", Policy()).flags
    argv = build_argv(facts.name, flags, served_name="m", tool_call_parser=None, reasoning_parser=None)
    assert _flag(argv, "--scheduling-policy") == "priority"
    budget = int(_flag(argv, "--max-num-batched-tokens"))
    assert budget == 256 and int(_flag(argv, "--long-prefill-token-threshold")) == 16  # vllm-cpu: 16 a step
    on_cpu = vllm_scheduling(flags, on_cpu=True)
    assert on_cpu.long_fields == {"priority": 1} and on_cpu.long_lane == 1
    gpu = VllmFlags(1, 0.9, 32768, 256, 8192)
    assert long_prefill_threshold(gpu) == 2048 and vllm_scheduling(gpu, on_cpu=False).long_lane * 2048 <= 8192 // 2


def test_the_plan_says_what_a_long_prompt_takes_of_a_vllm_step_and_why() -> None:
    facts = checkpoint_facts(json.loads((CONFIGS / "Qwen2.5-3B.json").read_text()), "Qwen2.5-3B")
    candidate = cpu_candidate(Checkpoint(facts.name, facts), 16 * GIB, "0.32.0", Policy())
    step = "     step: 256 tokens, a long prompt at most 16 of them beside others (each of a warm turn's steps waits"
    assert any(line.startswith(step) for line in report.summary([candidate], candidate))
    gpu = step_phrase(VllmFlags(1, 0.9, 32768, 256, 8192))
    assert gpu.startswith("step: 8,192 tokens, a long prompt at most 2,048 of them beside others (the rest of every")


def test_vllm_never_caps_a_prompt_past_the_context() -> None:
    assert long_prefill_threshold(VllmFlags(1, 0.9, 1024, 4, 8192)) == 1024  # vLLM refuses one above the context
    assert long_prefill_threshold(VllmFlags(1, 0.9, 4096, 4, 32)) == 16


def test_llama_server_places_the_long_prefill_in_its_last_slot_once_idle_read_as_it_is_sent() -> None:
    four = llama_scheduling(4)
    assert (four.long_lane, dict(four.long_fields)) == (1, {})
    assert four.long_pin is not None and four.long_pin.path == "/slots"
    place = four.long_pin.place

    def page(*busy: object) -> str:  # as b11434's server_slot::to_json writes each slot
        return json.dumps([{"id": i, "n_ctx": 4096, "is_processing": b, "id_task": 9} for i, b in enumerate(busy)])

    assert place(page(False, True, False, False), 1) == {"id_slot": 3}  # the gateway's one other request: slot 1
    assert place(page(False, False, False, True), 1) is None  # the last slot busy: not yet
    assert place(page(False, False, False, False), 1) is None  # one request on its way: it could take the last
    assert place('{"error": {"code": 501}}', 0) == place("<html>", 0) == place("[1, 2]", 0) == {}  # unpinned
    assert place(page(False, "no", False, False), 0) == {}  # not the slots list as llama-server writes it
    # the engine likely holds 2,048 tokens or more of the prompt: pinned to an empty last slot, b11434 would not
    # load them from its RAM cache (f_keep 0/0), so the slot is primed first (before: sent unpinned, into the
    # least recently used slot, where a warm turn in a later slot waited its whole prefill); a last slot
    # holding tokens is given as it is
    held_page = json.dumps(
        [{"id": i, "is_processing": False, "n_prompt_tokens": n} for i, n in enumerate((5, 0, 0, 0))]
    )
    holding = json.dumps(
        [{"id": i, "is_processing": False, "n_prompt_tokens": n} for i, n in enumerate((0, 0, 0, 900))]
    )
    primed = {"id_slot": 3, PRIME: True}
    assert place(held_page, 0, 20_000) == place(page(False, False, False, False), 0, 2048) == primed
    assert four.long_pin.primer is not None and four.long_pin.primer.marker == PRIME
    primer_body = four.long_pin.primer.body({"id_slot": 3})
    assert (four.long_pin.primer.path, primer_body["id_slot"], primer_body["n_predict"]) == ("/completion", 3, 1)
    assert place(held_page, 0, 2047) == place(holding, 0, 20_000) == place(held_page, 0) == {"id_slot": 3}
    assert place(page(False, False, False, True), 0, 20_000) is None  # busy: not yet, held or not
    one = llama_scheduling(1)  # llama-cpp-python's one slot: nothing runs beside a long prefill
    assert (one.long_lane, dict(one.long_fields), one.long_pin, one.prefill_first) == (0, {}, None, None)
    assert four.prefill_first is not None and four.prefill_first.fields["return_progress"] is True


def _native(gpu_layers: int, split: tuple[float, ...] = (), command: tuple[str, ...] = ("llama-server",)) -> list[str]:
    config = llamacpp.LlamaCppConfig(
        gguf=Path("/m.gguf"), served_name="m", context_length=4096, gpu_layers=gpu_layers, tensor_split=split,
        launcher=NATIVE,
    )  # fmt: skip
    return llamacpp.native_argv(config, command=list(command), port="1")


def test_llama_server_on_the_cpu_takes_64_tokens_a_step_so_a_warm_turn_beside_a_long_prompt_waits_little() -> None:
    assert _flag(_native(0), "-b") == str(CPU_BATCH) == "64"  # the CPU's attention runs tiled from 64 tokens
    assert _flag(_native(33), "-b") == "512"  # one GPU: one ubatch a step
    assert "-b" not in _native(33, (1, 1))  # several: the ubatches of a step are pipelined from device to device
    assert _native(0, command=("llama-server", "-b", "16", "-ub", "16")).count("-b") == 1  # the user's own stands
    assert _native(0, command=("llama-server", "--ubatch-size=64")).count("-b") == 0


def test_the_plan_says_why_it_chose_llama_servers_batch() -> None:
    assert batch(1, on_cpu=True).why.startswith("batch: -b 64 on the CPU: a warm turn's every step waits for")
    assert batch(1, on_cpu=False).argv == ("-b", "512") and "one GPU" in batch(1, on_cpu=False).why
    assert batch(1, on_cpu=True, given=["-b=128"]).why == "batch: as your llama-server command sets it"
    launch = llamacpp.build_launch(
        llamacpp.LlamaCppConfig(gguf=Path("/m.gguf"), served_name="m", context_length=4096, launcher=NATIVE),
        port=1,
        api_key="k",
        command=["llama-server"],
    )
    assert launch.scheduling is not None and "batch: -b 64 on the CPU" in launch.scheduling.means


def _drafting(gpu_layers: int, draft: str, command: tuple[str, ...] = ("llama-server",)) -> list[str]:
    config = llamacpp.LlamaCppConfig(
        gguf=Path("/m.gguf"), served_name="m", context_length=4096, gpu_layers=gpu_layers, launcher=NATIVE,
        draft=draft,
    )  # fmt: skip
    return llamacpp.native_argv(config, command=list(command), port="1")


def _step_tokens(argv: list[str], draft: str) -> int:
    """What one step must hold when every slot generates with its longest draft (llama-server aborts,
    server-context.cpp:576, when that is more than max(-b, -np))."""
    most = {"ngram": ("--spec-ngram-mod-n-max", 64), "mtp": ("--spec-draft-n-max", 3)}[draft]
    longest = int(_flag(argv, most[0])) if most[0] in argv else most[1]
    return int(_flag(argv, "-np")) * (1 + longest)


@pytest.mark.parametrize("gpu_layers", [0, 33])
@pytest.mark.parametrize("draft", ["ngram", "mtp"])
def test_every_slots_draft_fits_one_llama_server_step(gpu_layers: int, draft: str) -> None:
    """With -b 64 an n-gram draft of its own 64 tokens (65 with the sampled one) made llama-server abort at
    the first file asked back (GGML_ASSERT "batch must be large enough to hold the sampled and draft
    tokens"): each slot's draft is bounded so that all four slots' fit the step."""
    argv = _drafting(gpu_layers, draft)
    assert _step_tokens(argv, draft) <= int(_flag(argv, "-b"))
    if gpu_layers == 0 and draft == "ngram":
        assert [_flag(argv, f"--spec-ngram-mod-n-{n}") for n in ("max", "min")] == ["15", "11"]
    own = _drafting(0, "ngram", ("llama-server", "-b", "16"))  # the user's own batch: bounded by it
    assert _step_tokens(own, "ngram") <= 16 and own.count("-b") == 1
    theirs = _drafting(0, "ngram", ("llama-server", "--spec-ngram-mod-n-max=8"))  # the user's own bound stands
    assert "--spec-ngram-mod-n-max" not in theirs and "--spec-ngram-mod-n-max=8" in theirs


def test_the_plan_says_it_bounds_the_draft_and_why() -> None:
    why = batch(1, on_cpu=True, draft="ngram").why
    bound = "; drafts of at most 15 tokens, not ngram-mod's 64: 4 slots' tokens and drafts must fit one 64-token step"
    assert why.endswith(bound)
    assert batch(1, on_cpu=False, draft="ngram").draft_argv == ()  # 4 x 65 fit 512
    assert "drafts" not in batch(1, on_cpu=False, draft="ngram").why


@needs_native_llama_server
@pytest.mark.parametrize(
    ("gpus", "flag", "why"),
    [
        ("", "-b 64 ", "     batch: -b 64 on the CPU: a warm turn's every step waits for at most 64 tokens"),
        ("1x24GiB", "-b 512 ", "     batch: -b 512 on one GPU: a warm turn's every step waits for at most one ubatch"),
    ],
)
def test_the_plan_prints_llama_servers_batch_and_why(
    gpus: str, flag: str, why: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("gateway.core.devices.probe_nvml", lambda: ((), False, "none here"))  # a machine without GPUs
    args = ["plan", "--model", "smollm2-135m-instruct", "--engine", "llamacpp", "--llama-launcher", "native"]
    assert main([*args, "--ram", "32GiB", *(["--gpus", gpus] if gpus else [])]) == 0
    out = capsys.readouterr().out
    assert flag in out.splitlines()[3] and why in out


def test_the_plan_says_how_many_sessions_it_keeps_warm() -> None:
    goal = Goal(sessions=8)
    assert goal.warm_sessions(4 * 131072, 131072) == (4, 16)  # four full contexts, sixteen 32k prompts
    assert goal.warm_sessions(20_000, 16_384) == (1, 1)  # a context below 32k: the prompt is the context


@needs_native_llama_server
def test_more_sessions_asked_get_a_larger_prompt_cache_and_the_plan_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def plan(sessions: int) -> dict[str, Any]:
        args = ["plan", "--model", "glm-4.7-flash", "--gpus", "2x24GiB", "--ram", "128GiB", "--engine", "llamacpp"]
        assert main([*args, "--llama-launcher", "native", "--sessions", str(sessions), "--json"]) == 0
        data: dict[str, Any] = json.loads(capsys.readouterr().out)
        return data

    few, many = plan(4), plan(32)
    assert few["sessions"]["asked"] == 4 and many["sessions"]["asked"] == 32
    assert many["sessions"]["warm_tokens"] > few["sessions"]["warm_tokens"]
    assert many["sessions"]["warm_at_typical_prompt"] > few["sessions"]["warm_at_typical_prompt"] >= 4
    assert few["sessions"]["at_once"] == 4
