"""Flags are generated from the settings: one name per value, the same on `serve` and `plan`."""

from __future__ import annotations

import argparse

import pytest

from gateway.cli.commands import PLAN_SETTINGS, SERVE_SETTINGS, build_parser
from gateway.cli.flags import add_setting_flags, given
from gateway.cli.full_settings import Settings


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_every_setting_is_a_serve_flag_and_plan_uses_the_same_names() -> None:
    assert set(SERVE_SETTINGS) == set(Settings.model_fields)
    assert set(PLAN_SETTINGS) <= set(SERVE_SETTINGS)
    serve = _parse("serve", "--context-length", "8192", "--engine", "llamacpp")
    plan = _parse("plan", "--context-length", "8192", "--engine", "llamacpp")
    assert given(serve, SERVE_SETTINGS) == given(plan, PLAN_SETTINGS) == {"context_length": 8192, "engine": "llamacpp"}


def test_the_full_settings_are_the_gateways_and_every_registered_engines() -> None:
    """One declared class a reader and mypy can follow; the registry's mix of the engines' own
    settings must hold every backend's, in the registry's order."""
    from gateway.backends import registry

    assert registry.EngineSettings.__bases__ == tuple(backend.settings_model for backend in registry.BACKENDS)
    assert set(Settings.model_fields) == set(SERVE_SETTINGS)
    assert Settings.engine_pins == tuple(name for backend in registry.BACKENDS for name in backend.pins)
    assert Settings.model_fields["engine"].json_schema_extra == {
        "flags": ["--engine", "--backend"], "choices": list(registry.names())
    }  # fmt: skip


def test_each_engine_reads_its_own_settings_from_the_gateways() -> None:
    """``Backend.settings_model`` types what an engine reads: from the full settings it is the very object
    (its class derives from every engine's: nothing copied, the CLI's values seen); from settings without
    the engine's fields, those fields at their defaults."""
    from gateway.backends import registry
    from gateway.backends.base import own_settings
    from gateway.core.settings import Settings as GatewaySettings

    full = Settings(vllm_version="0.11.0", llama_launcher="python")
    for backend in registry.BACKENDS:
        assert own_settings(backend.settings_model, full) is full
    vllm_settings = registry.get("vllm").settings_model
    assert own_settings(vllm_settings, GatewaySettings()) == vllm_settings()
    assert registry.get("vllm").installation(full, probe=False).version_source == "given"


def test_an_alias_lands_on_the_same_setting() -> None:
    args = _parse("plan", "--max-model-len", "4096", "--backend", "vllm", "--launcher", "native")
    assert given(args, PLAN_SETTINGS) == {"context_length": 4096, "engine": "vllm", "llama_launcher": "native"}


def test_flags_not_given_are_none_so_the_environment_and_file_still_apply() -> None:
    assert given(_parse("serve"), SERVE_SETTINGS) == {}


def test_lists_are_parsed_the_way_each_setting_says() -> None:
    args = _parse(
        "serve", "--vllm-command", "/opt/v/bin/python -m vllm.entrypoints.openai.api_server",
        "--api-key", "a", "--api-key", "b", "--backend-native-apis", "responses,messages",
        "--enforce-eager", "--startup-timeout", "1.5",
    )  # fmt: skip
    values = given(args, SERVE_SETTINGS)
    assert values["vllm_command"] == ["/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert values["api_keys"] == ["a", "b"] and values["backend_native_apis"] == ["responses", "messages"]
    assert values["enforce_eager"] is True and values["startup_timeout_s"] == 1.5
    assert Settings(**values).vllm_command == values["vllm_command"]


def test_choices_are_enforced_at_the_command_line() -> None:
    with pytest.raises(SystemExit):
        _parse("plan", "--kv-cache-dtype", "fp4")


def test_help_text_comes_from_the_declaration() -> None:
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, ["queue_wait_s"])
    assert "Longest wait for a slot before 429. (default 600.0)" in parser.format_help().replace("\n", " ").replace(
        "  ", " "
    )
