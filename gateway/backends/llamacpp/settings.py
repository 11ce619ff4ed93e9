"""llama.cpp's own settings: which server runs it, which GGUF and how it drafts (its thread count is
the gateway's ``threads``, which a worker's device servers take too).

Declared here, composed into the gateway's settings through the registry (``Backend.settings_model``),
so the flag, the ``GATEWAY_*`` variable, the TOML key and the README row all come from this one place.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from gateway.backends.llamacpp.drafting import MODES as DRAFT_MODES
from gateway.backends.llamacpp.launcher import LAUNCHERS
from gateway.core.policy import Policy


class LlamaCppSettings(BaseModel):
    llama_cpp_python_command: list[str] | None = Field(
        None,
        description="argv prefix that runs llama-cpp-python's server; unset: this Python with `-m llama_cpp.server`.",
        json_schema_extra={"parse": "shlex"},
    )
    llama_server_command: list[str] | None = Field(
        None,
        description="argv prefix of the native llama-server; unset: `llama-server` if on PATH.",
        json_schema_extra={"parse": "shlex"},
    )
    quant: str | None = Field(
        None,
        description="For a hub model served by llama.cpp: the GGUF quantization (Q5_K_M) or file name to use; "
        "unset: the largest that fits (see `gateway plan`).",
    )
    llama_draft: str = Field(
        "auto",
        pattern=f"^({'|'.join(DRAFT_MODES)})$",
        description="llama-server's speculative decoding without a second model: auto drafts from the context "
        "(ngram-mod: text it repeats, e.g. code being rewritten) and with the model's own MTP block instead where "
        "the GGUF has one and it costs nothing else; mtp or ngram force one; off: none.",
        json_schema_extra={"choices": list(DRAFT_MODES)},
    )
    llama_launcher: str | None = Field(  # a launcher's name (backends.llamacpp.launcher), read by the backend
        None,
        pattern=f"^({'|'.join(LAUNCHERS)})$",
        description="llama.cpp's server: native (llama-server) or python (llama-cpp-python); unset: native "
        "when llama-server is found, else python.",
        json_schema_extra={"flags": ["--llama-launcher", "--launcher"], "choices": list(LAUNCHERS)},
    )


# the GGUF quantization a hub model is served at, and the draft mode, when the user chose them
PINS: tuple[str, ...] = ("quant", "llama_draft")
FILE_PINS: tuple[str, ...] = ("quant",)  # a remembered GGUF of another quantization is not reused


def pinned_quant(policy: Policy) -> str | None:
    """The quantization (or file name) the user pinned with --quant, if any."""
    value = policy.pins.engine.get("quant")
    return str(value) if value else None


def draft_setting(policy: Policy) -> str:
    """The draft mode the user chose (--llama-draft), else auto."""
    return str(policy.pins.engine.get("llama_draft") or "auto")
