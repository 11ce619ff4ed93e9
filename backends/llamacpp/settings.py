"""llama.cpp's own settings: which server runs it and with how many threads.

Declared here, composed into the gateway's settings through the registry (``Backend.settings_model``),
so the flag, the ``GATEWAY_*`` variable, the TOML key and the README row all come from this one place.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class LlamaCppSettings(BaseModel):
    threads: int | None = Field(None, ge=1, description="CPU threads for llama.cpp; unset: all cores.")
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
    llama_launcher: str | None = Field(
        None,
        pattern="^(python|native)$",
        description="llama.cpp's server: native (llama-server) or python (llama-cpp-python); unset: native "
        "when llama-server is found, else python.",
        json_schema_extra={"flags": ["--llama-launcher", "--launcher"], "choices": ["python", "native"]},
    )


PINS: tuple[str, ...] = ()  # llama.cpp's only pinned figure is the context length, which every engine shares
