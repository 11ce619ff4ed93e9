"""Record what each real agent CLI sends, as fixtures: tests/data/agent-requests/<agent>/NN-<route>.json.

    PYTHONPATH=. .venv/bin/python -m tests.integration.tools.record_agent_requests [AGENT ...]

For each agent (all six by default): the scripted upstream behind `gateway serve --backend-url`, the
recording proxy in front of the gateway, the agent configured by `gateway agent NAME --write --yes`
against the proxy, then two headless runs: the tool loop (WRITE_FILE: the agent's own file-writing tool,
its result sent back, the final answer) and the overflow (the same write call, then the engine's context
error on the request carrying its result, and whatever the agent does about it: compaction included);
Claude Code has a third, subagent (DELEGATE: a subagent that starts another, each with ids of its own).
The agent's folder is replaced; the temporary directory in paths and prompts becomes /tmp/agent so a
re-recording differs only where the agent does.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from tests.integration.agent_clis import (
    AGENTS,
    ROOT,
    SUBAGENT_AGENTS,
    Agent,
    ToolProcess,
    configure,
    overflow_prompt,
    recorded,
    run,
    subagent_prompt,
    tool_loop_prompt,
)
from tests.integration.gatewayproc import GatewayProcess

FIXTURES = ROOT / "tests" / "data" / "agent-requests"
STABLE_ROOT = "/tmp/agent"
RUNS = (("tool-loop", tool_loop_prompt), ("overflow", overflow_prompt))
SUBAGENT_RUN = ("subagent", subagent_prompt)


def record(agent: Agent, gateway: GatewayProcess, scratch: Path) -> list[str]:
    """Both runs of ``agent``; returns one summary line per run."""
    home = scratch / agent.name
    work = home / "project"
    work.mkdir(parents=True)
    folder = scratch / "requests" / agent.name  # not under a path that starts with HOME's: agent_clis.run kills
    folder.mkdir(parents=True)  # every process whose command line holds that after each run (the proxy was one)
    proxy = ToolProcess("recording_proxy.py", gateway.url, str(folder))
    lines = []
    try:
        configure(agent, home, proxy.url)
        for path in folder.glob("*.json"):
            path.unlink()  # `gateway agent` asking what is served, not the agent
        for label, prompt in (*RUNS, SUBAGENT_RUN) if agent.name in SUBAGENT_AGENTS else RUNS:
            before = len(list(folder.glob("*.json")))
            if label == "overflow":
                (work / "hello.txt").unlink(missing_ok=True)  # the overflow run writes it again first
            result = run(agent, home, work, prompt(agent.name, work), timeout_s=180)
            for path in sorted(folder.glob("*.json"))[before:]:
                entry = json.loads(path.read_text())
                path.write_text(json.dumps({"run": label, **entry}, indent=1, ensure_ascii=False) + "\n")
            statuses = [entry["status"] for entry in recorded(folder)[before:]]
            lines.append(f"{agent.name} {label}: exit {result.returncode}, {result.seconds:.1f} s, statuses {statuses}")
    finally:
        proxy.stop()
    target = FIXTURES / agent.name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path in sorted(folder.glob("*.json")):
        text = path.read_text().replace(str(scratch), STABLE_ROOT)
        for slug in {str(scratch).replace("/", "-"), re.sub(r"[^A-Za-z0-9]", "-", str(scratch))}:  # agents' slugs of it
            text = text.replace(slug, STABLE_ROOT.replace("/", "-"))
        (target / path.name).write_text(text)
    return lines


def main(names: list[str]) -> int:
    agents = [AGENTS[name] for name in names or AGENTS]
    with tempfile.TemporaryDirectory(prefix="record-agents-") as temporary:
        scratch = Path(temporary)
        upstream = ToolProcess("scripted_upstream.py", str(scratch / "upstream.events"), "32768")
        gateway = GatewayProcess(scratch, "--backend-url", upstream.url, "--model", "scripted",
                                 "--backend-native-apis", "include_usage")  # fmt: skip
        try:
            with gateway.serving():
                for agent in agents:
                    if reason := agent.missing():
                        print(f"{agent.name}: skipped ({reason})")
                        continue
                    for line in record(agent, gateway, scratch):
                        print(line, flush=True)
        finally:
            upstream.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
