"""Settings precedence: flags > GATEWAY_* environment > gateway.toml > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.full_settings import load_settings
from gateway.core.errors import ConfigError


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_defaults_apply_when_nothing_is_given(workdir: Path) -> None:
    settings = load_settings()
    assert (settings.host, settings.port, settings.model) == ("127.0.0.1", 8000, None)
    assert settings.backend_log_dir == settings.state_dir / "logs"


def test_toml_file_in_the_working_directory_overrides_defaults(workdir: Path) -> None:
    (workdir / "gateway.toml").write_text('port = 9001\nmodel = "glm-4.7-flash"\n')
    settings = load_settings()
    assert (settings.port, settings.model) == (9001, "glm-4.7-flash")


def test_environment_overrides_toml(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (workdir / "gateway.toml").write_text("port = 9001\nthreads = 3\n")
    monkeypatch.setenv("GATEWAY_PORT", "9002")
    settings = load_settings()
    assert settings.port == 9002
    assert settings.threads == 3  # untouched by the environment, still from the file


def test_flags_override_environment_and_none_means_not_given(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_PORT", "9002")
    monkeypatch.setenv("GATEWAY_HOST", "0.0.0.0")
    settings = load_settings({"port": 9003, "host": None})
    assert (settings.port, settings.host) == (9003, "0.0.0.0")


def test_list_setting_reads_json_from_the_environment(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_LLAMA_CPP_PYTHON_COMMAND", '["/opt/py/bin/python", "-m", "llama_cpp.server"]')
    assert load_settings().llama_cpp_python_command == ["/opt/py/bin/python", "-m", "llama_cpp.server"]


def test_explicit_config_file_via_environment(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = workdir / "elsewhere.toml"
    other.write_text("port = 7000\n")
    monkeypatch.setenv("GATEWAY_CONFIG", str(other))
    assert load_settings().port == 7000


def test_missing_explicit_config_file_is_a_clear_error(workdir: Path) -> None:
    with pytest.raises(ConfigError, match="does-not-exist.toml does not exist"):
        load_settings(config_file=workdir / "does-not-exist.toml")


def test_invalid_value_names_the_setting(workdir: Path) -> None:
    (workdir / "gateway.toml").write_text("port = 70000\n")
    with pytest.raises(ConfigError, match="invalid setting port"):
        load_settings()


def test_unknown_key_in_the_file_is_rejected(workdir: Path) -> None:
    (workdir / "gateway.toml").write_text("prot = 8001\n")
    with pytest.raises(ConfigError, match="prot"):
        load_settings()


def test_malformed_toml_is_a_clear_error(workdir: Path) -> None:
    (workdir / "gateway.toml").write_text("port = = 1\n")
    with pytest.raises(ConfigError, match="gateway.toml"):
        load_settings()


def test_each_engines_own_settings_come_from_the_same_sources(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared in gateway/backends/<engine>/settings.py, read like the gateway's own: file, environment,
    flags, with the engine's own validators; an unknown engine name is refused."""
    (workdir / "gateway.toml").write_text('threads = 3\nllama_launcher = "python"\n')
    monkeypatch.setenv("GATEWAY_KV_CACHE_MEMORY_BYTES", "4G")
    settings = load_settings({"max_num_seqs": 8})
    assert (settings.threads, settings.llama_launcher) == (3, "python")
    assert settings.kv_cache_memory_bytes == 4 * 1024**3
    assert settings.max_num_seqs == 8
    with pytest.raises(ConfigError, match="unknown engine 'tgi'"):
        load_settings({"engine": "tgi"})
    with pytest.raises(ConfigError, match="llama_launcher"):
        load_settings({"llama_launcher": "rust"})


# -- issue 30: a value that cannot be read is blamed on where it came from ------------------------------------
def test_a_variable_that_is_not_json_is_named_not_the_toml_file(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_CORS_ALLOW_ORIGINS", "*")
    with pytest.raises(ConfigError) as refused:
        load_settings()
    said = str(refused.value)
    assert said.startswith("cannot read GATEWAY_CORS_ALLOW_ORIGINS: it is not JSON") and """'["a", "b"]'""" in said
    assert "gateway.toml" not in said


def test_a_key_variable_that_cannot_be_read_is_not_repeated(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", "sk-secret-value")
    with pytest.raises(ConfigError, match="cannot read GATEWAY_API_KEYS") as refused:
        load_settings()
    assert "sk-secret" not in str(refused.value)


@pytest.mark.parametrize(
    ("where", "said"),
    [("flag", "(from a flag)"), ("variable", "(from GATEWAY_PORT)"), ("file", "gateway.toml)")],
)
def test_an_invalid_value_names_its_source(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, where: str, said: str
) -> None:
    (workdir / "gateway.toml").write_text("port = 70000\n" if where == "file" else "")
    if where == "variable":
        monkeypatch.setenv("GATEWAY_PORT", "0")
    with pytest.raises(ConfigError, match="invalid setting port") as refused:
        load_settings({"port": 0} if where == "flag" else None)
    assert str(refused.value).endswith(said) and str(refused.value).count("(from") == 1


def test_the_settings_declare_what_serve_reads_of_the_engines_own(workdir: Path) -> None:
    """serve reads "was a file pinned?" (a remembered GGUF of another quantization must not be reused)
    and the thread count through declared, typed members, not by probing for an engine's field names."""
    from gateway.cli.full_settings import Settings

    assert Settings.file_pins == ("quant",)
    assert load_settings({"quant": "Q4_K_M"}).files_pinned()
    assert not load_settings().files_pinned()
    assert not load_settings({"max_num_seqs": 8, "llama_draft": "off"}).files_pinned()  # pins, but no file
    assert load_settings({"threads": 3}).threads == 3
