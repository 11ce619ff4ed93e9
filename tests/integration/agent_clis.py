"""The six real coding-agent CLIs, as a user runs them: configured only by `gateway agent NAME --write --yes`
into a fresh HOME, then run headless with their own flags for "no questions asked".

scripts/test installs them at the versions below (npm into .agents/, aider into .agents/aider-venv/).
Each run is bounded by a timeout and its whole process group is killed afterwards (several agents leave
helpers behind: a local server, a language server, a background hub).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.integration.gatewayproc import free_port
from tests.waiting import exited, wait_until

ROOT = Path(__file__).resolve().parents[2]
AGENTS_DIR = ROOT / ".agents"
NPM_BIN = AGENTS_DIR / "node_modules" / ".bin"
TOOLS_DIR = Path(__file__).resolve().parent / "tools"

# What scripts/test installs; the README's agent section names the same.
VERSIONS = {
    "claude": ("@anthropic-ai/claude-code", "2.1.328"),
    "qwen": ("@qwen-code/qwen-code", "0.24.4"),
    "opencode": ("opencode-ai", "1.18.33"),
    "cline": ("cline", "3.0.65"),
    "codex": ("@openai/codex", "0.169.0"),
    "aider": ("aider-chat", "0.86.2"),
}

# No telemetry, update checks or other calls home: the tests talk to 127.0.0.1 only.
QUIET = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "QWEN_TELEMETRY_ENABLED": "false",
    "QWEN_CODE_DISABLE_PRECONNECT": "1",
    "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "CLINE_NO_AUTO_UPDATE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # aider's litellm would fetch its price list otherwise
    "NO_COLOR": "1",
    "TERM": "dumb",
}


@dataclass(frozen=True)
class Agent:
    name: str  # as `gateway agent NAME` knows it
    command: Callable[[Path, str], list[str]]  # (project dir, prompt) -> argv
    own_overflow: tuple[str, ...]  # the agent's own words for "the prompt does not fit" (any one)
    env: tuple[tuple[str, str], ...] = ()

    @property
    def package(self) -> str:
        return VERSIONS[self.name][0]

    @property
    def version(self) -> str:
        return VERSIONS[self.name][1]

    def executable(self) -> Path:
        return AGENTS_DIR / "aider-venv" / "bin" / "aider" if self.name == "aider" else NPM_BIN / self.name

    def missing(self) -> str | None:
        """Why this agent cannot run here, or None."""
        if not self.executable().exists():
            return f"{self.executable()} is missing: ./scripts/test installs {self.package}=={self.version}"
        return None


def _npm(name: str, *flags: str) -> Callable[[Path, str], list[str]]:
    return lambda _work, prompt: [str(NPM_BIN / name), *flags, prompt]


AGENTS: dict[str, Agent] = {
    agent.name: agent
    for agent in (
        # -p: print mode; root may skip permission prompts only inside a sandbox, which IS_SANDBOX declares
        Agent("claude", _npm("claude", "-p", "--dangerously-skip-permissions"), ("Prompt is too long",),
              (("IS_SANDBOX", "1"),)),
        Agent("qwen", _npm("qwen", "-p", "--yolo"), ("maximum context length",)),
        Agent("opencode", _npm("opencode", "run"), ("compact", "summar", "context")),
        # a prompt argument without -i runs one task in act mode with every tool approved, then exits
        Agent("cline", _npm("cline"), ("context window exceeded",)),
        Agent("codex", lambda work, prompt: [
            str(NPM_BIN / "codex"), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
            "-C", str(work), prompt,
        ], ("ran out of room in the model's context window",)),
        Agent("aider", lambda _work, prompt: [
            str(AGENTS_DIR / "aider-venv" / "bin" / "aider"), "--yes-always", "--no-git", "--no-analytics",
            "--no-check-update", "--no-show-release-notes", "--no-pretty", "--no-show-model-warnings",
            "--message", prompt,
        ], ("hit a token limit",)),
    )
}  # fmt: skip


def tool_loop_prompt(name: str, work: Path) -> str:
    """The scripted upstream's cue for a call of the agent's own file-writing tool (creating hello.txt)."""
    # aider's edits name files relative to the project; every other agent's write tool wants a full path
    return f"WRITE_FILE {'hello.txt' if name == 'aider' else work / 'hello.txt'}"


SUBAGENT_ANSWER = "hello from below"
SUBAGENT_AGENTS = ("claude",)  # the agents whose headless run can start a subagent (Claude Code's Agent tool)


def subagent_prompt(_name: str, _work: Path) -> str:
    """The cue for a subagent that starts another, the innermost saying SUBAGENT_ANSWER (each waited for)."""
    return f"DELEGATE DELEGATE SAY {SUBAGENT_ANSWER}"


def overflow_prompt(name: str, work: Path) -> str:
    """The cue for llama-server's context error: after a tool call where there is one, as a conversation
    that grew past the window (what an agent with history can compact); aider has no tool calls."""
    return "OVERFLOW: what is in this folder?" if name == "aider" else f"{tool_loop_prompt(name, work)} then OVERFLOW"


@dataclass(frozen=True)
class Run:
    argv: list[str]
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + "\n" + self.stderr

    def tail(self, chars: int = 3000) -> str:
        head = f"exit {self.returncode} after {self.seconds:.1f} s"
        return f"{head}\n--- stdout\n{self.stdout[-chars:]}\n--- stderr\n{self.stderr[-chars:]}"


def configure(agent: Agent, home: Path, url: str) -> str:
    """`gateway agent NAME --write --yes --url URL` with HOME=home: the only configuration the agent gets."""
    env = {**os.environ, "HOME": str(home)}
    for variable in ("CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME", "CLINE_DIR", "CLINE_DATA_DIR"):
        env.pop(variable, None)
    written = subprocess.run(
        [sys.executable, "-m", "gateway", "agent", agent.name, "--write", "--yes", "--url", url],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert written.returncode == 0, written.stdout + written.stderr
    return written.stdout


def run(agent: Agent, home: Path, work: Path, prompt: str, timeout_s: float) -> Run:
    """The agent headless in ``work``; its process group is killed afterwards whatever happened."""
    env = {
        "PATH": f"{NPM_BIN}:{os.environ['PATH']}",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "GATEWAY_API_KEY": "anything",  # the agents that read the key from a variable (the gateway has none)
        **QUIET,
        **dict(agent.env),
    }
    argv = agent.command(work, prompt)
    started = time.monotonic()
    process = subprocess.Popen(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        stdout, stderr = process.communicate()
        code = None
    finally:
        _kill_group(process.pid)
        _kill_leftovers(home)
    return Run(argv, code, stdout.decode(errors="replace"), stderr.decode(errors="replace"), time.monotonic() - started)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _kill_leftovers(home: Path) -> None:
    """What the agent left running in its own session (Cline's hub daemon leaves the process group):
    every process working in, or started with, this run's HOME."""
    for process in psutil.process_iter(["pid", "cmdline", "cwd"]):
        with contextlib.suppress(psutil.Error):
            cwd = process.info["cwd"] or ""
            if cwd.startswith(str(home)) or str(home) in " ".join(process.info["cmdline"] or []):
                process.kill()


class ToolProcess:
    """One of tests/integration/tools/ as a process on a free port (the scripted upstream, the recorder)."""

    def __init__(self, script: str, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(TOOLS_DIR / script), str(self.port), *args])
        try:
            wait_until(
                self._listening, what=f"{script} to listen", timeout_s=30, interval_s=0.1, abort=exited(self.proc)
            )
        except AssertionError:
            self.stop()
            raise

    def _listening(self) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def recorded(folder: Path) -> list[dict[str, Any]]:
    """What a recording_proxy.py wrote to ``folder``, in arrival order."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
