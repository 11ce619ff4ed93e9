"""How llama.cpp's two servers word a prompt longer than the context (read from their sources).

llama-server (b11434, tools/server): ``request (8766 tokens) exceeds the available context size (8192
tokens), try increasing it`` with ``"type": "exceed_context_size_error"``; builds before the numbers
were added said ``the request exceeds the available context size, try increasing it``.
llama-cpp-python 0.3.36: the engine raises ``Requested tokens (9000) exceed context window of 8192``
and its server rewrites that into OpenAI's ``This model's maximum context length is 8192 tokens.
However, you requested 9000 tokens (8500 in the messages, 500 in the completion)``.
"""

from __future__ import annotations

import re

OVERFLOW_PATTERNS = (
    re.compile(r"request \((?P<prompt>\d+) tokens\) exceeds the available context size \((?P<context>\d+) tokens\)"),
    re.compile(r"the request exceeds the available context size"),
    re.compile(r"Requested tokens \((?P<prompt>\d+)\) exceed context window of (?P<context>\d+)"),
    re.compile(r"maximum context length is (?P<context>\d+) tokens\. However, you requested (?P<prompt>\d+) tokens"),
)
