"""llama.cpp's two launch methods as values: the native llama-server and llama-cpp-python's server.

One engine, two servers (DESIGN.md): they load the same GGUF the same way but differ in how many
requests they run at once, what they reserve for them (logits rows, sliding-window cells), whether
they turn flash attention on themselves, what llama-server alone can do (devices over RPC, drafting,
sessions kept warm, MoE experts in RAM, thinking split out), and how they are started (key variable,
health path, the APIs they serve natively). Each difference is a field here, so that planning and
launching ask the launcher instead of comparing its name; the name is the user's setting
(``llama_launcher``) and what ``plan --json`` prints. Their argv and ``Launch`` are built in
:mod:`gateway.backends.llamacpp.argv`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.backends.base import Capability
from gateway.core.devices import Device

UBATCH = 512  # the physical batch both servers run (llama.cpp's default -ub)
NATIVE_PARALLEL = 4  # llama-server's slots (-np), sharing one unified KV cache of n_ctx cells (-kvu)


@dataclass(frozen=True)
class Launcher:
    """What one launch method means for memory, planning and starting the server."""

    name: str  # the setting's value and the plan's "launcher": "native" | "python"
    server: str  # what the console calls it: "llama-server" | "llama-cpp-python"
    slots: int  # requests at once, each with its own recurrent states
    outputs: int  # rows of logits reserved: one per slot natively; llama-cpp-python a whole ubatch
    always_flash: bool  # flash attention on by itself (llama-server); else only where we ask (GPUs)
    window_per_slot: bool  # a sliding-window layer keeps each slot's window (else the full-size cache)
    over_rpc: bool  # other nodes' devices join through ggml-rpc-server (--rpc)
    drafts: bool  # speculative decoding without a second model (backends.llamacpp.drafting)
    keeps_warm: bool  # room in the unified cache, prompt cache and checkpoints (backends.llamacpp.warm_sessions)
    experts_in_ram: bool  # MoE experts alone left in RAM (--n-cpu-moe)
    splits_reasoning: bool  # thinking split out of content by the server (--reasoning-format)
    key_variable: str  # the variable the server reads its API key from (never argv: /proc/PID/cmdline)
    health_path: str  # answers 200 once the model is loaded
    native_apis: frozenset[Capability]  # what the server does itself, so the gateway does not redo it
    shown_command: tuple[str, ...]  # the argv prefix `plan` prints when none is installed
    missing: str  # what `serve` says when this launcher was chosen but is not installed
    sampling_means: str  # how it applies a model's recommended sampling (gateway/backends/sampling.py)
    own_sampling: str  # what samples a request without sampling fields when the model recommends nothing

    def flash_attention(self, gpus: tuple[Device, ...]) -> bool:
        """The native server turns it on by itself; with llama-cpp-python we turn it on for GPUs, where
        without it the attention scores of a long context need gigabytes of scratch per device."""
        return self.always_flash or bool(gpus)


NATIVE = Launcher(
    name="native",
    server="llama-server",
    slots=NATIVE_PARALLEL,
    outputs=NATIVE_PARALLEL,
    always_flash=True,
    window_per_slot=True,
    over_rpc=True,
    drafts=True,
    keeps_warm=True,
    experts_in_ram=True,
    splits_reasoning=True,
    key_variable="LLAMA_API_KEY",
    health_path="/health",
    # Not its /v1/responses and /v1/messages: measured with llm-comply against build 11434 they miss
    # required fields (Responses 3/13 passed, Messages 3/9), so the gateway translates those to its chat
    # completions (tool calls still parsed by llama-server from the GGUF's template) and completes the
    # chat shapes (logprobs, refusal) there too.
    native_apis=frozenset({Capability.INCLUDE_USAGE, Capability.MAX_COMPLETION_TOKENS}),
    shown_command=("llama-server",),
    missing="llama-server was chosen (llama_launcher = native) but is not installed: set llama_server_command "
    "or pip install 'gateway[llamacpp-native]'",
    sampling_means="llama-server's defaults (--temp, --top-p, --top-k, --min-p, --repeat-penalty...); a request's "
    "own fields win",
    own_sampling="llama-server's own defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05)",
)
PYTHON = Launcher(
    name="python",
    server="llama-cpp-python",
    slots=1,
    outputs=UBATCH,
    always_flash=False,
    window_per_slot=False,
    over_rpc=False,
    drafts=False,
    keeps_warm=False,
    experts_in_ram=False,
    splits_reasoning=False,
    key_variable="API_KEY",  # its server settings (pydantic, no prefix)
    health_path="/v1/models",  # answers once the model is loaded (the server loads it before it binds the port)
    native_apis=frozenset(),  # no Responses/Messages, no usage chunk
    shown_command=("python", "-m", "llama_cpp.server"),
    missing="llama-cpp-python is not installed in this environment: pip install 'gateway[llamacpp]' "
    "(or set llama_cpp_python_command to a Python that has it)",
    # its server has no flags for default sampling (llama_cpp/server/settings.py): each request gets them
    sampling_means="added by the gateway to each request that leaves them out (llama-cpp-python's server takes "
    "no defaults); a request's own fields win",
    own_sampling="llama-cpp-python's own request defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, "
    "repeat_penalty 1.1)",
)
LAUNCHERS = {launcher.name: launcher for launcher in (PYTHON, NATIVE)}  # the setting's values


def launcher_named(name: str) -> Launcher:
    """The launcher a setting (``llama_launcher``, an installation's build) names."""
    return LAUNCHERS[name]
