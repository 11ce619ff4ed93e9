"""Every failure before serving is one line that names the fix, exit status 1, no traceback, and
nothing left behind (no engine started, no state written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli.commands import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, [line for line in err.splitlines() if line.startswith("gateway: error:")]


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    directory = tmp_path / "catalog"
    directory.mkdir()
    return directory


CASES = {
    "a missing gguf": (["--model", "/nowhere/model.gguf"], "no such file or directory"),
    "an unknown name": (["--model", "llama-9"], "unknown model 'llama-9'"),
    "a context above the model's limit": (["--model", "gemma-3-270m", "--context-length", "99999999"], "exceeds"),
    "a bad port": (["--port", "0"], "invalid setting port"),
    "a missing config file": (["--config", "/nowhere/gateway.toml"], "does not exist"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_to_serve_is_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, expected = CASES[case]
    code, errors = _run(capsys, "serve", "--state-dir", str(tmp_path / "state"), *argv)
    assert code == 1 and len(errors) == 1 and expected in errors[0], errors
    assert not (tmp_path / "state" / "logs").exists(), "an engine was started"


def test_a_catalog_dir_that_is_not_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, errors = _run(capsys, "serve", "--state-dir", str(tmp_path), "--catalog-dir", str(tmp_path / "none"))
    assert code == 1 and "is not a directory" in errors[0]


def test_a_broken_catalog_entry(catalog: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (catalog / "m.toml").write_text("name = \n")
    code, errors = _run(capsys, "plan", "--catalog-dir", str(catalog), "--model", "m")
    assert code == 1 and "not valid TOML" in errors[0]


def test_an_entry_whose_config_json_is_missing(catalog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (catalog / "m.toml").write_text('name = "m"\nhf_config = "hf/m.json"\n[vllm]\ncheckpoint = "org/m"\n')
    code, errors = _run(capsys, "plan", "--catalog-dir", str(catalog), "--model", "m", "--gpus", "1x24GiB")
    assert code == 1 and "cannot read hf_config" in errors[0] and "fix the path" in errors[0]


def test_a_bad_gpu_spec(capsys: pytest.CaptureFixture[str]) -> None:
    code, errors = _run(capsys, "plan", "--model", "gemma-3-270m", "--gpus", "2xlots")
    assert code == 1 and len(errors) == 1


def test_an_unexpected_error_is_still_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import commands as cli

    def broken(_args: object) -> int:
        raise KeyError("surprise")

    monkeypatch.setattr(cli, "plan_command", broken)
    code, errors = _run(capsys, "plan")
    assert code == 1 and "unexpected KeyError" in errors[0] and "rerun with -v" in errors[0]


BAD_PLAN_INPUT = {
    "GPUs without a unit": (["--gpus", "2x32"], "size '32' has no unit: write it like 32GiB"),
    "RAM without a unit": (["--gpus", "2x32GiB", "--ram", "64"], "size '64' has no unit"),
    "an unknown flag": (["--bogus"], "unrecognized arguments: --bogus"),
    "a bad choice": (["--engine", "foo"], "invalid choice: 'foo'"),
    "a bad number": (["--min-context", "abc"], "invalid int value: 'abc'"),
    "a flag without its value": (["--gpus"], "expected one argument"),
}


@pytest.mark.parametrize("case", list(BAD_PLAN_INPUT))
def test_bad_input_to_plan_exits_1_not_2(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    """2 means "nothing fits"; argparse's own errors used to exit 2 too."""
    argv, expected = BAD_PLAN_INPUT[case]
    try:
        code = main(["plan", "--model", "glm-4.7-flash", *argv])
    except SystemExit as exited:  # argparse's errors end the process here
        code = int(exited.code or 0)
    err = capsys.readouterr().err
    assert code == 1 and expected in err, err


def test_no_command_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 1


def test_gpus_with_ram_without_a_unit_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, errors = _run(capsys, "gpus", "--gpus", "2x24GiB", "--ram", "64")
    assert code == 1 and "size '64' has no unit" in errors[0]
