"""Issue 49: every model samples as its authors recommend, on both engines. The recommendation comes from
the checkpoint's generation_config.json, the GGUF's general.sampling.* keys or the catalog's card values
(in that order of trust); llama-server takes it as its default flags, vLLM reads generation_config.json
itself (the plan's argv never overrides it), and a request's own fields always win."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.backends.llamacpp.argv import SAMPLING_FLAGS, LlamaCppConfig, build_launch, native_argv
from gateway.backends.llamacpp.launcher import PYTHON
from gateway.backends.sampling import UNSAID, Sampling, checked, first, from_generation_config
from gateway.cli.commands import main
from gateway.cli.full_settings import Settings
from gateway.core.devices import GIB, Inventory, inventory
from gateway.planning.catalog import Catalog, builtin_catalog
from gateway.planning.from_settings import plan_for
from gateway.planning.plan_report import to_json
from tests.integration.tools.local_hub import LocalHub
from tests.synthetic_gguf import make_llama_shapes
from tests.unit.http_harness import FakeEngine, make_runtime
from tests.unit.test_http_gateway import BODIES, _gateway

CODER = "Qwen/Qwen3-Coder-30B-A3B-Instruct"  # the test hub's copy carries its generation_config.json
TINY = {"layers": 4, "embd": 512, "heads": 8, "kv_heads": 2, "head_dim": 64, "ff": 1024, "vocab": 32000}
GGUF_SAMPLING = {"general.sampling.temp": 0.6, "general.sampling.top_k": 30, "general.sampling.min_p": 0.02}
CARD = '[sampling]\ntemperature = 0.3\ntop_p = 0.85\nsource = "model card of example/tiny"\n'


def sampling_flags(argv: list[str]) -> dict[str, float]:
    """The sampling flags of a llama-server argv, by the recommended sampling's field names."""
    names = {flag: name for name, flag in SAMPLING_FLAGS.items()}
    return {names[word]: float(argv[i + 1]) for i, word in enumerate(argv) if word in names}


def cpu_plan(model: str, catalog: Catalog | None = None) -> dict[str, Any]:
    """The plan's JSON for ``model`` on a 64 GiB CPU machine with llama-server."""
    ram = 64 * GIB
    settings = Settings(model=model, llama_launcher="native", vllm_version="0.32.0")
    entry = (catalog or builtin_catalog()).resolve(model)
    return to_json(plan_for(settings, entry, Inventory((), ram, ram, source="simulated"), serving=False), 8000)


def llama_chosen(plan: dict[str, Any]) -> dict[str, Any]:
    chosen = plan["candidates"][plan["decision"]["candidate"]]
    assert chosen["backend"] == "llamacpp"
    return dict(chosen)


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    """A small llama GGUF (header and tensor table) whose header recommends temperature 0.6, top_k 30, min_p 0.02."""
    return make_llama_shapes(tmp_path / "tiny.gguf", TINY, "tiny", metadata=GGUF_SAMPLING)


def entry_dir(tmp_path: Path, gguf_path: Path, card: str = CARD) -> Catalog:
    """A user catalog with one entry for ``gguf_path`` and the card's ``[sampling]`` table."""
    folder = tmp_path / "catalog"
    folder.mkdir()
    text = f'name = "tiny"\n{card}\n[llamacpp]\ngguf_path = "{gguf_path}"\n'
    (folder / "tiny.toml").write_text(text)
    return Catalog.from_dir(folder)


# -- the sources, each reaching llama-server's argv ---------------------------------------------------------


def test_the_catalogs_card_values_are_llama_servers_defaults(tmp_path: Path) -> None:
    """The embedded default's catalog entry carries its card's temperature 0.2, top_p 0.9; a GGUF without
    general.sampling.* keys is started with them, and what the card leaves unsaid is off as on vLLM."""
    smollm = builtin_catalog().resolve("smollm2-135m-instruct").sampling
    assert smollm is not None and (smollm.temperature, smollm.top_p) == (0.2, 0.9)
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in smollm.source
    plain = make_llama_shapes(tmp_path / "plain.gguf", TINY, "plain")
    chosen = llama_chosen(cpu_plan("tiny", entry_dir(tmp_path, plain)))
    assert sampling_flags(chosen["argv"]) == UNSAID | {"temperature": 0.3, "top_p": 0.85}
    assert chosen["sampling"]["source"] == "catalog: model card of example/tiny"
    assert chosen["sampling"]["values"] == {"temperature": 0.3, "top_p": 0.85}


def test_a_ggufs_general_sampling_keys_are_llama_servers_defaults_and_outrank_the_catalog(
    tmp_path: Path, gguf: Path
) -> None:
    alone = llama_chosen(cpu_plan(str(gguf)))
    assert sampling_flags(alone["argv"]) == UNSAID | {"temperature": 0.6, "top_k": 30, "min_p": 0.02}
    assert alone["sampling"]["source"] == f"general.sampling.* of {gguf}"
    with_card = llama_chosen(cpu_plan("tiny", entry_dir(tmp_path, gguf)))
    assert with_card["sampling"] == alone["sampling"]  # the file's own keys before the card's values


def test_a_hub_models_generation_config_reaches_llama_server_and_vllm_keeps_its_own_reading(hub: LocalHub) -> None:
    """The same model planned on vLLM and fallen back to llama.cpp starts with the same defaults: vLLM
    applies generation_config.json itself (--generation-config auto, never overridden on its argv:
    every sampling field the file gives, ModelConfig.get_diff_sampling_param), llama-server gets
    those values as flags and the fields the file leaves unsaid off, as vLLM leaves them."""
    settings = Settings(model=CODER, llama_launcher="native", vllm_version="0.32.0")
    entry = builtin_catalog().resolve(CODER)
    plan = to_json(plan_for(settings, entry, inventory("2x24GiB@8.9", "64GiB"), serving=False), 8000)
    vllm = plan["candidates"][plan["decision"]["candidate"]]
    llama = plan["candidates"][plan["decision"]["fallback"]["candidate"]]
    assert (vllm["backend"], llama["backend"]) == ("vllm", "llamacpp")
    assert not [word for word in vllm["argv"] if "generation-config" in word]
    published = json.loads(hub.repos[CODER.lower()].files["generation_config.json"].read(0, 1 << 16))
    read_by_vllm = {name: published[name] for name in SAMPLING_FLAGS if name in published}
    assert read_by_vllm == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    assert sampling_flags(llama["argv"]) == UNSAID | read_by_vllm
    assert vllm["sampling"]["values"] == llama["sampling"]["values"] == read_by_vllm
    assert vllm["sampling"]["source"] == llama["sampling"]["source"] == f"generation_config.json of {CODER}"
    assert "vLLM reads the file itself" in vllm["sampling"]["applied"]
    assert plan["decision"]["sampling"].startswith("sampling: temperature 0.7, top_p 0.8, top_k 20")


def test_a_checkpoint_directorys_generation_config_is_what_the_vllm_plan_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local checkpoint: its own generation_config.json is read beside its config.json."""
    configs = Path(__file__).resolve().parents[1] / "data" / "configs"
    (tmp_path / "config.json").write_text((configs / "Qwen3-8B.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16 << 30}}))
    published = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [151645]}
    (tmp_path / "generation_config.json").write_text(json.dumps(published))
    assert main(["plan", "--model", str(tmp_path), "--gpus", "1x80GiB@9.0", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    chosen = plan["candidates"][plan["decision"]["candidate"]]
    assert chosen["backend"] == "vllm" and not [word for word in chosen["argv"] if "generation" in word]
    assert chosen["sampling"]["values"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert chosen["sampling"]["source"] == f"generation_config.json of {tmp_path}"


def test_no_recommendation_leaves_the_engines_own_defaults(tmp_path: Path) -> None:
    plain = make_llama_shapes(tmp_path / "plain.gguf", TINY, "plain")
    chosen = llama_chosen(cpu_plan(str(plain)))
    assert sampling_flags(chosen["argv"]) == {}
    assert chosen["sampling"]["source"] is None and "llama-server's own defaults" in chosen["sampling"]["applied"]


# -- the fact itself ------------------------------------------------------------------------------------


def test_the_first_source_that_gives_a_value_wins_and_every_sources_notes_are_kept() -> None:
    generation = from_generation_config({"do_sample": True, "eos_token_id": 2}, "a/b")  # no sampling field
    gguf = checked({"temperature": 0.5, "top_k": "many"}, "general.sampling.* of x.gguf")
    card = checked({"temperature": 0.2}, "catalog: card")
    found = first(generation, gguf, card)
    assert found is not None and found.given() == {"temperature": 0.5}
    assert found.notes == ("general.sampling.* of x.gguf: top_k = 'many' left out (a number from -1 to 1,048,576)",)
    assert first(None, None) is None


@pytest.mark.parametrize(
    ("value", "kept"),
    [(0.7, 0.7), (float("nan"), None), (-1.0, None), (True, None), ("0.7", None), (1e9, None), (0, 0.0)],
)
def test_a_hostile_value_is_left_out_with_a_note_never_passed_on(value: Any, kept: float | None) -> None:
    found = checked({"temperature": value}, "generation_config.json of evil/repo")
    assert (found.temperature if found else None) == kept
    if kept is None:
        assert found is not None and not found.recommends and "temperature" in found.notes[0]


def test_top_k_off_is_written_as_llama_cpps_zero() -> None:
    found = from_generation_config({"top_k": -1, "temperature": 1.0}, "a/b")
    assert found is not None and found.top_k == 0 and found.complete()["top_k"] == 0


def test_vllm_argv_never_carries_a_generation_config_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The catalog's card values are shown for vLLM, never passed: vLLM reads the checkpoint's own file."""
    code = main(["plan", "--model", "glm-4.7-flash", "--gpus", "2x32607MiB@12.0", "--ram", "64GiB", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    vllm = [c for c in plan["candidates"] if c["backend"] == "vllm" and c["argv"]]
    assert vllm and not [w for c in vllm for w in c["argv"] if "generation" in w or w == "--temperature"]
    assert vllm[0]["sampling"]["values"] == {"temperature": 1.0, "top_p": 0.95}


def test_plan_shows_the_sampling_and_its_source_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry_dir(tmp_path, make_llama_shapes(tmp_path / "plain.gguf", TINY, "plain"))
    argv = ["plan", "--catalog-dir", str(tmp_path / "catalog"), "--model", "tiny", "--llama-launcher", "native"]
    assert main([*argv, "--ram", "16GiB"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sampling:")]
    assert lines == [
        "sampling: temperature 0.3, top_p 0.85 (catalog: model card of example/tiny); llama-server's defaults "
        "(--temp, --top-p, --top-k, --min-p, --repeat-penalty...); a request's own fields win"
    ]
    assert main([*argv, "--ram", "16GiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"]["sampling"] == lines[0]


# -- a request's own fields win -------------------------------------------------------------------------


def test_llama_cpp_python_gets_the_defaults_as_request_fields() -> None:
    """Its server takes no sampling defaults: the launch names them for the gateway to add."""
    config = LlamaCppConfig(
        gguf=Path("m.gguf"), served_name="m", context_length=4096, launcher=PYTHON, sampling=Sampling(temperature=0.2)
    )
    launch = build_launch(config, port=1, api_key="k", command=["python", "-m", "llama_cpp.server"])
    expected = {"repeat_penalty" if name == "repetition_penalty" else name: value for name, value in UNSAID.items()}
    assert launch.request_defaults == expected | {"temperature": 0.2}
    assert "--temp" not in launch.argv


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("defaults", [{}, {"temperature": 0.2, "top_p": 0.9}], ids=["engine-defaults", "added"])
def test_a_requests_own_temperature_reaches_the_engine_unchanged(
    engine: FakeEngine, engine_url: str, path: str, defaults: dict[str, float]
) -> None:
    """In every dialect: a request's temperature is the one the engine gets; one without gets nothing
    from the gateway where the engine has defaults of its own (llama-server's flags, vLLM's file), and
    the launch's request defaults where it has none (llama-cpp-python)."""
    with _gateway(make_runtime(engine_url, request_defaults=defaults)) as client:
        own = client.post(path, json={**BODIES[path], "temperature": 0.93})
        bare = client.post(path, json=BODIES[path])
        assert (own.status_code, bare.status_code) == (200, 200), own.text + bare.text
    sent = [json.loads(seen["raw"]) for seen in engine.requests_to("/v1/chat/completions")]
    assert sent[0]["temperature"] == 0.93 and sent[0].get("top_p") == defaults.get("top_p")
    assert (sent[1].get("temperature"), sent[1].get("top_p")) == (defaults.get("temperature"), defaults.get("top_p"))


def test_a_flag_of_the_users_own_llama_server_command_is_left_to_it() -> None:
    """llama_server_command = "llama-server --temp 0": the plan's --temp after it would win, so it is left out."""
    config = LlamaCppConfig(
        gguf=Path("m.gguf"), served_name="m", context_length=4096, sampling=Sampling(temperature=0.2)
    )
    for given in (["llama-server", "--temp", "0"], ["llama-server", "--temperature=0"]):
        argv = native_argv(config, command=given, port="1")
        assert sampling_flags(argv[len(given) :]) == {name: v for name, v in UNSAID.items() if name != "temperature"}
    assert sampling_flags(native_argv(config, command=["llama-server"], port="1"))["temperature"] == 0.2
