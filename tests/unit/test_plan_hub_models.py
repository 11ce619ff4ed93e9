"""The planner's JSON for a model named only by hub id, per family and machine: the real
huggingface_hub client against the local hub (tests/integration/tools/local_hub.py), the GGUF
headers read over range requests, the quantized checkpoints on vLLM's ladder, the parsers chosen.

Each row: (model, machine) → the engine chosen, what it loads (vLLM checkpoint or GGUF quantization)
and, for llama.cpp, how many GPUs the layers are split over. The expectations are what the plan's own
rules give for these sizes (reviewed by hand against the figures in the plan), so a change in
sizing or ranking shows here as a changed row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.backends import registry
from gateway.backends.base import Installation
from gateway.backends.vllm import releases
from gateway.cli.commands import main
from gateway.cli.full_settings import Settings
from gateway.core.devices import GIB, Inventory, inventory
from gateway.core.model_entry import ModelEntry
from gateway.hub import search
from gateway.planning import from_settings
from gateway.planning.catalog import builtin_catalog
from gateway.planning.from_settings import plan_for
from gateway.planning.plan_report import to_json
from gateway.planning.planner import EnginePlan
from tests.integration.tools.local_hub import LocalHub
from tests.unit.plan_helpers import objective_broken

ROOT = Path(__file__).resolve().parents[2]
MACHINES = {
    "2x16@7.0": "2x16GiB@7.0",
    "2x16@8.9": "2x16GiB@8.9",
    "2x24@8.6": "2x24GiB@8.6",
    "2x24@8.9": "2x24GiB@8.9",
    "2x32@12.0": "2x32GiB@12.0",
    "1x80@9.0": "1x80GiB@9.0",
    "cpu": None,
}


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[Any, Any]]:
    """One hub cache and one memory of searches for this module's tests."""
    return tmp_path_factory.mktemp("hf"), {}


@pytest.fixture(scope="module")
def read_models() -> dict[str, list[Any]]:
    """Each engine's reading of each model, by model, for the rows: what a plan reads does not depend
    on the machine (candidates() leaves the model as read: the test at the end)."""
    return {}


@pytest.fixture
def read_once(read_models: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows' plans read each model once and evaluate it on each machine: the reading is
    test_hub_*.py's, and each model's first row reads it cold."""
    real = from_settings.read_engines

    def read_engines(entry: ModelEntry, installations: dict[str, Installation]) -> list[EnginePlan]:
        if entry.name not in read_models:
            read_models[entry.name] = [engine.model for engine in real(entry, installations)]
        return [
            EnginePlan(backend, installations[backend.name], model)
            for backend, model in zip(registry.BACKENDS, read_models[entry.name], strict=True)
        ]

    monkeypatch.setattr(from_settings, "read_engines", read_engines)


@pytest.fixture
def hub(hub: LocalHub, module_cache: tuple[Path, dict[Any, Any]], monkeypatch: pytest.MonkeyPatch) -> LocalHub:
    """tests/unit/conftest.py's local hub with the cache kept across this module's tests: each model is
    read from the hub once (cold, as a user's first plan reads it), then planned on each machine from
    what was read, the way a second `gateway plan` is. The rows test the plans; test_hub_*.py, the
    reading."""
    from huggingface_hub import constants

    home, searches = module_cache
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(search, "_SEARCHES", searches)
    return hub


@pytest.fixture(scope="module")
def planned() -> dict[tuple[str, str], dict[str, Any]]:
    """Each (model, machine)'s plan JSON as :func:`plan_json` first made it in this module: the tests
    below that only read a row's plan read the row's own (the same settings and inputs) instead of
    planning it again."""
    return {}


def plan_of(planned: dict[tuple[str, str], dict[str, Any]], model: str, machine: str) -> dict[str, Any]:
    if (model, machine) not in planned:
        planned[model, machine] = plan_json(model, machine)
    return planned[model, machine]


def plan_json(model: str, machine: str) -> dict[str, Any]:
    spec = MACHINES[machine]
    if spec is None:
        ram = 64 * GIB
        inv = Inventory((), ram, ram, source="simulated")
    else:
        inv = inventory(spec, "64GiB")
    settings = Settings(model=model, llama_launcher="native", vllm_version="0.32.0")
    entry = builtin_catalog().resolve(model)
    return to_json(plan_for(settings, entry, inv, serving=False), 8000)


def summary(data: dict[str, Any]) -> tuple[str | None, str, int]:
    """(engine, what it loads, GPUs the llama.cpp layers are split over)."""
    decision = data["decision"]
    if decision["candidate"] is None:
        return None, "", 0
    chosen = data["candidates"][decision["candidate"]]
    if decision["backend"] == "vllm":
        return "vllm", chosen["checkpoint"], int(chosen.get("tensor_parallel_size") or 0)
    split = [share for share in chosen["tensor_split"] if share > 0]
    gpus = len(split) if chosen["n_gpu_layers"] else 0
    return "llamacpp", chosen["gguf_variant"]["quant"], gpus


CODER = "Qwen/Qwen3-Coder-30B-A3B-Instruct"
QWEN = "Qwen/Qwen3-8B"
OSS = "openai/gpt-oss-20b"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DEVSTRAL = "mistralai/Devstral-Small-2507"
GLM = "zai-org/GLM-4.5-Air"
GEMMA = "google/gemma-3-27b-it"
DEEPSEEK = "deepseek-ai/DeepSeek-V3.1"
GEMMA4 = "google/gemma-4-31B-it"
NEXT = "Qwen/Qwen3-Next-80B-A3B-Instruct"
GRANITE = "ibm-granite/granite-4.0-h-small"
KIMI = "moonshotai/Kimi-K2-Instruct"

# the parsers vLLM is started with, per family (tool-call, reasoning)
PARSERS = {
    CODER: ("qwen3_coder", None),
    QWEN: ("hermes", "qwen3"),
    OSS: ("openai", "openai_gptoss"),
    LLAMA: ("llama3_json", None),
    DEVSTRAL: ("mistral", None),
    GLM: ("glm45", "glm45"),
    GEMMA: (None, None),  # Gemma 3's template renders no tools
    DEEPSEEK: ("deepseek_v31", "deepseek_v3"),
    GEMMA4: ("gemma4", "gemma4"),
    NEXT: ("hermes", None),  # the Instruct model does not think
    GRANITE: ("granite4", None),
    KIMI: ("kimi_k2", None),
}

# Each row: the decision the plan's objective (gateway/backends/objective.py, README "Plan it") gives, and why
# where it is not the obvious one. The objective: the 65,536 floor (the model's maximum when smaller;
# 32,768 on a CPU); no fragile setting (weights in RAM beside GPUs, < 4 bits, a raised utilization,
# eager, < 4 sequences) before anything else; context up to 131,072; an acceptable speed; precision;
# speed. vLLM whenever one of its rungs meets the floor without offload.
TABLE = [
    # model, machine, engine, what it loads, GPUs (vLLM: TP size; llama.cpp: GPUs the layers are split
    # over), context
    (
        CODER,
        "2x16@8.9",
        "llamacpp",
        "Q5_K_M",
        2,
        131072,
    ),  # no vLLM rung (FP8 is 15 GiB/card); Q6_K needs experts in RAM for 131k, Q5_K_M does not
    (CODER, "2x24@8.6", "vllm", "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8", 2, 133120),
    (CODER, "2x24@8.9", "vllm", "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8", 2, 133120),
    (
        CODER,
        "2x32@12.0",
        "vllm",
        "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8",
        2,
        253952,
    ),  # BF16 needs util 0.97 and 8 seqs; FP8 at the default reaches more than the target
    (CODER, "1x80@9.0", "vllm", CODER, 1, 131072),
    (CODER, "cpu", "llamacpp", "Q5_K_M", 0, 32768),  # Q5_K_M reaches 10 tokens/s with q8_0 KV; more bits than Q4_K_M
    (QWEN, "2x16@8.9", "vllm", QWEN, 2, 40960),
    (QWEN, "2x24@8.6", "vllm", QWEN, 2, 40960),
    (QWEN, "2x24@8.9", "vllm", QWEN, 2, 40960),
    (QWEN, "2x32@12.0", "vllm", QWEN, 2, 40960),
    (QWEN, "1x80@9.0", "vllm", QWEN, 1, 40960),
    (QWEN, "cpu", "llamacpp", "Q4_K_M", 0, 32768),  # nothing reaches 10 tokens/s: the fastest of 4 bits or more
    (OSS, "2x16@8.9", "vllm", OSS, 2, 131072),  # its own MXFP4 checkpoint: native, full precision; not a hybrid
    (OSS, "2x24@8.6", "vllm", OSS, 2, 131072),
    (OSS, "2x24@8.9", "vllm", OSS, 2, 131072),
    (OSS, "2x32@12.0", "vllm", OSS, 2, 131072),
    (OSS, "1x80@9.0", "vllm", OSS, 1, 131072),
    (
        OSS,
        "cpu",
        "llamacpp",
        "MXFP4",
        0,
        32768,
    ),  # MXFP4 is the format gpt-oss is released in: full precision, and the fastest (Q4_K_M is requantized)
    (LLAMA, "2x16@8.9", "vllm", LLAMA, 2, 131072),
    (LLAMA, "2x24@8.6", "vllm", LLAMA, 2, 131072),
    (LLAMA, "2x24@8.9", "vllm", LLAMA, 2, 131072),
    (LLAMA, "2x32@12.0", "vllm", LLAMA, 2, 131072),
    (LLAMA, "1x80@9.0", "vllm", LLAMA, 1, 131072),
    (LLAMA, "cpu", "llamacpp", "Q4_K_M", 0, 32768),
    (
        DEVSTRAL,
        "2x16@8.9",
        "llamacpp",
        "Q5_K_M",
        2,
        131072,
    ),  # BF16 does not fit vLLM; Q5_K_M reaches 131k whole, Q6_K and Q8_0 do not
    (DEVSTRAL, "2x24@8.6", "llamacpp", "Q8_0", 2, 131072),
    (
        DEVSTRAL,
        "2x24@8.9",
        "llamacpp",
        "Q8_0",
        2,
        131072,
    ),  # 24B BF16 does not fit vLLM; Q8_0 fits both cards whole at 131k
    (DEVSTRAL, "2x32@12.0", "vllm", DEVSTRAL, 2, 131072),
    (DEVSTRAL, "1x80@9.0", "vllm", DEVSTRAL, 1, 131072),
    (DEVSTRAL, "cpu", "llamacpp", "Q4_K_M", 0, 32768),
    # 106B MoE: nothing fits whole at the floor. The hub's "Q2_K" file is 4.5 bits per weight by its tensor table
    # (its experts' down projections, rows of 1,408, are not K-quantizable: the stand-in stores them as Q8_0,
    # llama-quantize would pick IQ4_NL): a 4-bit file,
    # and at ~10.6 tokens/s with experts in RAM an acceptable speed where Q4_K_M's ~9.7 is not
    (GLM, "2x16@8.9", "llamacpp", "Q2_K", 2, 131072),
    (GLM, "2x24@8.6", "llamacpp", "Q4_K_M", 2, 131072),
    (GLM, "2x24@8.9", "llamacpp", "Q4_K_M", 2, 131072),
    (
        GLM,
        "2x32@12.0",
        "llamacpp",
        "Q4_K_M",
        2,
        131072,
    ),  # Q2_K whole reaches only 32k (below the floor): Q4_K_M with experts in RAM
    (GLM, "1x80@9.0", "llamacpp", "Q2_K", 1, 131072),  # the 4.5-bit "Q2_K" whole at 131,072 (Q4_K_M: 65,536)
    (GLM, "cpu", "llamacpp", "Q2_K", 0, 32768),  # the smallest file is the one that fits 64 GiB of RAM
    (GEMMA, "2x16@8.9", "llamacpp", "Q6_K", 2, 131072),
    (GEMMA, "2x24@8.6", "llamacpp", "Q8_0", 2, 131072),
    (GEMMA, "2x24@8.9", "llamacpp", "Q8_0", 2, 131072),
    (GEMMA, "2x32@12.0", "vllm", GEMMA, 2, 123904),  # BF16 at the default share, fp8 KV for 123,904
    (GEMMA, "1x80@9.0", "vllm", GEMMA, 1, 131072),
    (GEMMA, "cpu", "llamacpp", "Q4_K_M", 0, 32768),
    (DEEPSEEK, "2x16@8.9", None, "", 0, 0),  # 671B: nothing fits these machines; the plan says so, with the parsers
    (DEEPSEEK, "2x24@8.6", None, "", 0, 0),
    (DEEPSEEK, "2x24@8.9", None, "", 0, 0),
    (DEEPSEEK, "2x32@12.0", None, "", 0, 0),
    (DEEPSEEK, "1x80@9.0", None, "", 0, 0),
    (DEEPSEEK, "cpu", None, "", 0, 0),
    (GEMMA4, "2x16@8.9", "llamacpp", "Q5_K_M", 2, 131072),
    (GEMMA4, "2x24@8.6", "vllm", "nvidia/Gemma-4-31B-IT-NVFP4", 2, 208896),
    (
        GEMMA4,
        "2x24@8.9",
        "vllm",
        "nvidia/Gemma-4-31B-IT-NVFP4",
        2,
        208896,
    ),  # ModelOpt NVFP4 runs from 7.5 (Marlin); BF16 does not fit
    (
        GEMMA4,
        "2x32@12.0",
        "vllm",
        "nvidia/Gemma-4-31B-IT-NVFP4",
        2,
        262144,
    ),  # BF16 needs util 0.97: NVFP4 at the default reaches the model maximum
    (GEMMA4, "1x80@9.0", "vllm", GEMMA4, 1, 175104),  # BF16 with fp8 KV: context to the target before KV precision
    (GEMMA4, "cpu", "llamacpp", "Q4_K_M", 0, 32768),
    (
        NEXT,
        "2x16@8.9",
        "llamacpp",
        "Q2_K",
        2,
        131072,
    ),  # 80B MoE: the largest GGUF with every layer on the cards (below 4 bits before RAM)
    (NEXT, "2x24@8.6", "llamacpp", "Q3_K_M", 2, 262144),
    (NEXT, "2x24@8.9", "llamacpp", "Q3_K_M", 2, 262144),
    (NEXT, "2x32@12.0", "llamacpp", "Q5_K_M", 2, 262144),
    (
        NEXT,
        "1x80@9.0",
        "vllm",
        "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8",
        1,
        163840,
    ),  # FP8 fits only the 80 GB card, and only at util 0.98; vLLM meets the floor, --prefix-match-unit 16 keeps
    # its turns warm inside 1,072-token blocks (a later turn re-prefills at most 16 tokens; llama.cpp's 4)
    # 3B active: Q6_K reads fast enough from RAM but leaves no RAM for a context checkpoint (every turn would
    # re-prefill the whole conversation); Q5_K_M keeps 8 per slot
    (NEXT, "cpu", "llamacpp", "Q5_K_M", 0, 32768),
    (GRANITE, "2x16@8.9", "llamacpp", "Q6_K", 2, 131072),  # FP8 at TP2 does not fit 16 GB cards
    (GRANITE, "2x24@8.6", "vllm", "ibm-granite/granite-4.0-h-small-FP8", 2, 131072),
    (GRANITE, "2x24@8.9", "vllm", "ibm-granite/granite-4.0-h-small-FP8", 2, 131072),
    (
        GRANITE,
        "2x32@12.0",
        "vllm",
        GRANITE,
        2,
        131072,
    ),  # BF16 at the default share with fp8 KV and 8 seqs reaches the target; --prefix-match-unit 16 inside
    # 1,056-token blocks keeps turns warm (16 tokens a turn at most; llama.cpp's checkpoints 4)
    (GRANITE, "1x80@9.0", "vllm", GRANITE, 1, 131072),
    (GRANITE, "cpu", "llamacpp", "Q4_K_M", 0, 32768),
    (KIMI, "2x16@8.9", None, "", 0, 0),  # 1T MoE: nothing fits
    (KIMI, "2x24@8.6", None, "", 0, 0),
    (KIMI, "2x24@8.9", None, "", 0, 0),
    (KIMI, "2x32@12.0", None, "", 0, 0),
    (KIMI, "1x80@9.0", None, "", 0, 0),
    (KIMI, "cpu", None, "", 0, 0),
]


@pytest.mark.parametrize(("model", "machine", "engine", "loads", "gpus", "context"), TABLE)
def test_each_family_on_each_machine(
    hub: LocalHub,
    read_once: None,
    planned: dict[tuple[str, str], dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    machine: str,
    engine: str | None,
    loads: str,
    gpus: int,
    context: int,
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test")  # Llama is gated: the local hub wants a token, any token
    data = plan_of(planned, model, machine)
    assert summary(data) == (engine, loads, gpus), data["decision"]["why"] or data["decision"]["reason"]
    assert objective_broken(data, releases.default_utilization("0.32.0")) is None
    if engine is not None:
        assert data["candidates"][data["decision"]["candidate"]]["context_length"] == context
    tool, reasoning = PARSERS[model]
    notes = " ".join(data["notes"])
    assert f"tool-call parser {tool or 'none'}, reasoning parser {reasoning or 'none'}" in notes
    assert ("agents cannot call tools" in notes) == (tool is None)
    if engine is None:
        assert data["decision"]["reason"].startswith("nothing fits") and "no GGUF quantization fits" in notes
        return
    chosen = data["candidates"][data["decision"]["candidate"]]
    if engine == "vllm":
        argv = chosen["argv"]
        assert ("--enable-auto-tool-choice" in argv) == (tool is not None)
        assert tool is None or argv[argv.index("--tool-call-parser") + 1] == tool
        assert ("--reasoning-parser" in argv) == (reasoning is not None)
        return
    # llama.cpp: the file and its quantization named, every alternative with its figures, the rule kept
    table = chosen["gguf_alternatives"]
    picked = [row for row in table if row["chosen"]]
    assert len(picked) == 1 and picked[0]["quant"] == loads == chosen["gguf_variant"]["quant"]
    model_path = chosen["argv"][chosen["argv"].index("-m") + 1]
    assert model_path == "/".join([chosen["gguf_variant"]["repo"], chosen["gguf_variant"]["files"][0]])
    assert loads in model_path and "--jinja" in chosen["argv"]
    assert f"chose {chosen['gguf_variant']['repo']}/" in notes


def test_the_headline_plans_llamacpp_pooled_over_both_cards(hub: LocalHub) -> None:
    """`gateway plan --model Qwen/Qwen3-Coder-30B-A3B-Instruct --gpus 2x24GiB@8.9 --ram 64GiB`: vLLM
    fits only with the FP8 checkpoint (above); llama.cpp, asked for, pools the most precise quantization
    whose every layer fits over both cards at the full context, and says why, with the thinking-free
    Qwen3-Coder template."""
    settings = Settings(model=CODER, llama_launcher="native", engine="llamacpp")
    plan = plan_for(settings, builtin_catalog().resolve(CODER), inventory("2x24GiB@8.9", "64GiB"), serving=False)
    data = to_json(plan, 8000)
    chosen = data["candidates"][data["decision"]["candidate"]]
    assert data["decision"]["backend"] == "llamacpp"
    assert chosen["n_gpu_layers"] == 49 and chosen["n_cpu_moe"] == 0  # 48 blocks + output, none in RAM
    assert len(chosen["tensor_split"]) == 2 and min(chosen["tensor_split"]) > 0.4 * sum(chosen["tensor_split"])
    assert all(memory["model"] > 10_000 for name, memory in chosen["memory_mib"].items() if name != "host")
    assert chosen["gguf_variant"] == {
        "repo": "unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF",
        "files": ["Qwen3-Coder-30B-A3B-Instruct-Q8_0.gguf"],
        "quant": "Q8_0",
    }
    # every layer on the GPUs at the model's full context: the most bits per weight wins
    assert chosen["gguf_choice"].startswith("Q8_0: context 131,072") and "Q6_K: less precise" in chosen["gguf_choice"]
    assert chosen["reasoning_format"] is None  # Qwen3-Coder does not think


def test_the_headline_decides_vllm_fp8_with_llamacpp_pooled_as_the_fallback(hub: LocalHub) -> None:
    """Both engines planned: vLLM TP2 on the official FP8 checkpoint fits (14.5 GiB of weights per card);
    the plan also names what `serve` starts when vLLM does not start or is not installed."""
    settings = Settings(model=CODER, llama_launcher="native")
    plan = plan_for(settings, builtin_catalog().resolve(CODER), inventory("2x24GiB@8.9", "64GiB"), serving=False)
    decision = to_json(plan, 8000)["decision"]
    assert decision["backend"] == "vllm" and "fp8 TP2" in decision["reason"]
    fallback = decision["fallback"]
    assert fallback["backend"] == "llamacpp" and plan.fallback is plan.candidates[fallback["candidate"]]
    assert plan.fallback is not None and plan.fallback.fits and plan.fallback is plan.engine("llamacpp").best  # type: ignore[union-attr]
    assert " -ngl 49 " in fallback["command"] and " -ts " in fallback["command"]
    assert decision["installed"] is (plan.engine("vllm").installation.command is not None)  # type: ignore[union-attr]


def test_quant_pins_one_quantization_and_an_unknown_one_lists_the_others(hub: LocalHub) -> None:
    from gateway.core.errors import ConfigError

    settings = Settings(model=CODER, llama_launcher="native", engine="llamacpp", quant="Q5_K_M")
    plan = plan_for(settings, builtin_catalog().resolve(CODER), inventory("2x24GiB@8.9", "64GiB"), serving=False)
    chosen = to_json(plan, 8000)["candidates"][plan.decision_index or 0]
    assert chosen["gguf_variant"]["quant"] == "Q5_K_M" and "pinned with --quant" in chosen["gguf_choice"]
    by_file = Settings(model=CODER, llama_launcher="native", engine="llamacpp", quant="Instruct-Q6_K.gguf")
    plan = plan_for(by_file, builtin_catalog().resolve(CODER), inventory("2x24GiB@8.9", "64GiB"), serving=False)
    assert to_json(plan, 8000)["candidates"][0]["gguf_variant"]["quant"] == "Q6_K"
    with pytest.raises(ConfigError, match="--quant Q9_K: no such GGUF among BF16 .*Q8_0 .*Q2_K"):
        unknown = Settings(model=CODER, llama_launcher="native", engine="llamacpp", quant="Q9_K")
        plan_for(unknown, builtin_catalog().resolve(CODER), inventory("2x24GiB@8.9", "64GiB"), serving=False)


def test_a_thinking_model_gets_llama_servers_reasoning_format(hub: LocalHub) -> None:
    settings = Settings(model=QWEN, llama_launcher="native", engine="llamacpp")
    plan = plan_for(settings, builtin_catalog().resolve(QWEN), inventory("1x24GiB@8.9", "64GiB"), serving=False)
    argv = to_json(plan, 8000)["candidates"][plan.decision_index or 0]["argv"]
    assert argv[argv.index("--reasoning-format") + 1] == "deepseek" and "--jinja" in argv


def test_the_headline_command_as_typed(
    local_hub: tuple[str, LocalHub], hub: LocalHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's command, run as a user runs it, with HF_ENDPOINT aimed at the local hub; then with
    --engine llamacpp (in this process: one start of the CLI is enough to show the environment read)."""
    url, _ = local_hub
    env = {
        **os.environ,
        "HF_ENDPOINT": url,
        "HF_HOME": str(tmp_path / "hf"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "gateway", "plan", "--model", CODER, "--gpus", "2x24GiB@8.9", "--ram", "64GiB"]
    done = subprocess.run([*argv, "--llama-launcher", "native"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "nothing fits" not in out and "no GGUF for this model" not in out
    assert "  ok Q8_0 (" in out and "chose unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF/" in out
    assert "note: vLLM: tool-call parser qwen3_coder, reasoning parser none" in out
    lines = out.splitlines()
    assert lines[0].startswith("decision: vLLM: Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8 (fp8), TP2")
    assert "--tool-call-parser qwen3_coder" in lines[3]  # the FP8 checkpoint, TP2
    # vLLM is not installed in the test's environment: the same command shows what `serve` starts here,
    # llama.cpp with the Q8_0 GGUF pooled over both cards
    assert lines[4].startswith("other engine: llama.cpp: unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF/")
    assert "Q8_0.gguf, 2 GPUs (-ts " in lines[4] and "all layers" in lines[4]
    assert "vllm is not installed here: `serve` on this machine starts this instead" in lines[5]
    fallback = lines[6]
    assert "Qwen3-Coder-30B-A3B-Instruct-Q8_0.gguf" in fallback and " -ngl 49 " in fallback and " -ts " in fallback
    capsys.readouterr()
    pooled = main([*argv[3:], "--llama-launcher", "native", "--engine", "llamacpp"])
    stdout = capsys.readouterr().out
    first = stdout.splitlines()
    command = first[3]
    assert pooled == 0 and first[0].startswith("decision: llama.cpp: ") and "  => Q8_0 (" in stdout
    assert "Qwen3-Coder-30B-A3B-Instruct-Q8_0.gguf" in command and " -ngl 49 " in command and " -ts " in command
    assert "--jinja" in command


def test_a_remembered_quantization_does_not_override_a_pinned_one() -> None:
    from gateway.backends.llamacpp import LlamaCppConfig, LlamaCppOption

    q8 = {"repo": "o/r", "files": ["m-Q8_0.gguf"], "size": 8, "quant": "Q8_0"}
    q5 = {"repo": "o/r", "files": ["m-Q5_K_M.gguf"], "size": 5, "quant": "Q5_K_M"}
    planned = LlamaCppOption(LlamaCppConfig(Path("m-Q5_K_M.gguf"), "m", 4096), ("llama-server",), variant=q5)
    memo = {"gguf": "/cache/m-Q8_0.gguf", "context_length": 8192, "gpu_layers": 0, "tensor_split": [], "kv_type": "f16"}
    with pytest.raises(ValueError, match="another quantization"):
        planned.from_memo(memo | {"hub_variant": q8})
    same = planned.from_memo(memo | {"hub_variant": q5, "gguf": "/cache/m-Q5_K_M.gguf"})
    assert same.config.gguf == Path("/cache/m-Q5_K_M.gguf") and same.memo()["hub_variant"] == q5


def test_when_no_quantization_fits_the_plan_says_so_and_shows_the_smallest(hub: LocalHub) -> None:
    settings = Settings(model=GLM, llama_launcher="native", vllm_version="0.32.0")
    plan = plan_for(settings, builtin_catalog().resolve(GLM), inventory("1x8GiB@8.9", "16GiB"), serving=False)
    assert plan.chosen is None and "nothing fits" in plan.decision_reason
    assert any("no GGUF quantization fits" in note and "GLM-4.5-Air-Q2_K.gguf" in note for note in plan.notes)
    shown = plan.candidates_of("llamacpp")
    assert shown and all(not c.fits for c in shown) and shown[0].variant["quant"] == "Q2_K"


def test_a_gated_model_without_a_token_plans_llamacpp_from_a_public_gguf_and_names_hf_token(
    hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its metadata is public and the community's GGUFs are not gated; its own files (config.json,
    for vLLM) are: the plan says so in one line naming HF_TOKEN and serves what it can. In this process,
    without a token (the command as typed, reading its environment, is the headline test's)."""
    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # a cache of its own, as a user's first plan of the model has (this module's is shared by its rows)
    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(search, "_SEARCHES", {})
    code = main(["plan", "--model", LLAMA, "--gpus", "1x24GiB@8.9", "--ram", "64GiB"])
    stdout = capsys.readouterr().out
    assert code == 0
    lines = [line for line in stdout.splitlines() if "HF_TOKEN" in line]
    assert lines == [
        f"note: vLLM not planned: {LLAMA} is gated: accept its licence on the hub, then export "
        "HF_TOKEN=<a token with access> and retry"
    ]
    assert stdout.startswith("decision: llama.cpp: bartowski/Meta-Llama-3.1-8B-Instruct-GGUF/")


def test_a_discovered_nvfp4_checkpoint_meets_the_capability_gate(
    hub: LocalHub, planned: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """The NVFP4 rung is on the ladder and judged by the release's gate: refused below 7.5 with the
    source line it rests on, taken on 8.9 (weight-only through Marlin) and 12.0."""
    data = plan_json(GEMMA4, "2x16@7.0")
    nvfp4 = [c for c in data["candidates"] if c.get("checkpoint") == "nvidia/Gemma-4-31B-IT-NVFP4"]
    assert nvfp4 and not any(c["fits"] for c in nvfp4)
    assert all("7.5" in c["reason"] and "7.0" in c["reason"] for c in nvfp4), [c["reason"] for c in nvfp4]
    assert any(
        c.get("checkpoint") == "nvidia/Gemma-4-31B-IT-NVFP4" and c["fits"]
        for c in plan_of(planned, GEMMA4, "2x24@8.9")["candidates"]
    )
    ok = plan_of(planned, GEMMA4, "2x32@12.0")
    assert any(c.get("checkpoint") == "nvidia/Gemma-4-31B-IT-NVFP4" and c["fits"] for c in ok["candidates"])


def test_candidates_leave_the_model_as_read_and_options_take_what_they_found(hub: LocalHub) -> None:
    """candidates() chose the quantization by writing it into the model, which options() read back:
    two evaluations of one model (a re-plan over other devices) left the first one's options on the
    second one's GGUF. Each evaluation now carries its own choice, and the model stays as read."""
    import copy

    from gateway.backends import llamacpp, vllm
    from gateway.core.policy import Policy

    model = llamacpp.BACKEND.read(builtin_catalog().resolve(CODER))
    as_read = copy.deepcopy(model)
    native = Installation(("llama-server",), "11434", "installed", "native")
    small = llamacpp.BACKEND.candidates(model, inventory("1x24GiB@8.9", "64GiB"), Policy(), native)
    large = llamacpp.BACKEND.candidates(model, inventory("2x32GiB@12.0", "64GiB"), Policy(), native)
    assert model == as_read
    assert small.variant is not None and large.variant is not None and small.variant.quant != large.variant.quant
    assert any(small.variant.label in note for note in small.notes)
    (option,) = llamacpp.BACKEND.options(model, small, Policy(), native, Settings())
    assert option.memo()["hub_variant"]["quant"] == small.variant.quant
    # vLLM's too (the rows above read each model once and plan it on each machine)
    checkpoints = vllm.BACKEND.read(builtin_catalog().resolve(CODER))
    as_read = copy.deepcopy(checkpoints)
    installed = Installation(("vllm",), "0.32.0", "installed")
    for machine in ("2x16GiB@8.9", "2x24GiB@8.9", "1x80GiB@9.0"):
        vllm.BACKEND.candidates(checkpoints, inventory(machine, "64GiB"), Policy(), installed)
    assert checkpoints == as_read


# Issue 42: the hybrid rows name what a later turn re-prefills on each engine, and decide by it
HYBRID_ROWS = [
    (NEXT, "1x80@9.0", 16, "--prefix-match-unit 16 inside 1,072-token blocks"),
    (GRANITE, "2x32@12.0", 16, "--prefix-match-unit 16 inside 1,056-token blocks"),
]


@pytest.mark.parametrize(("model", "machine", "tokens", "setting"), HYBRID_ROWS)
def test_a_hybrid_row_names_what_a_later_turn_re_prefills_on_each_engine(
    hub: LocalHub, planned: dict[tuple[str, str], dict[str, Any]], model: str, machine: str, tokens: int, setting: str
) -> None:
    data = plan_of(planned, model, machine)
    decision = data["decision"]
    chosen = data["candidates"][decision["candidate"]]
    assert chosen["warm_turn"]["tokens"] == tokens and setting in chosen["reason"]
    assert chosen["argv"][chosen["argv"].index("--prefix-match-unit") + 1] == "16"
    other = data["candidates"][decision["fallback"]["candidate"]]
    assert (
        other["backend"] == "llamacpp" and other["warm_turn"]["tokens"] == 4 and "server-context.cpp" in other["reason"]
    )
    assert objective_broken(data, releases.default_utilization("0.32.0")) is None


def test_gpt_oss_on_a_cpu_plans_its_native_mxfp4(hub: LocalHub, planned: dict[tuple[str, str], dict[str, Any]]) -> None:
    data = plan_of(planned, OSS, "cpu")
    chosen = data["candidates"][data["decision"]["candidate"]]
    assert chosen["gguf_variant"]["quant"] == "MXFP4"
    # ranked by the file's real bits, not its name's 4.85: the hub's stand-in Q4_K_M of gpt-oss stores its
    # matrices (rows of 2,880, not K-quantizable) as Q8_0, 8.45 bits per weight over the tensor table
    assert "Q4_K_M: less precise (8.45 bits per weight" in chosen["gguf_choice"]
