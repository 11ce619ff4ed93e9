"""vLLM's OpenAI server started with the plan's argv less --prefix-match-unit N: what a hybrid's later turn
costs without it (benchmarks/agent_sessions.py --vllm-command "<vLLM's python> this file")."""

import runpy
import sys

args = sys.argv[1:]
if "--prefix-match-unit" in args:
    at = args.index("--prefix-match-unit")
    del args[at : at + 2]
sys.argv = ["vllm.entrypoints.openai.api_server", *args]
runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
