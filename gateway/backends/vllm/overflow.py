"""How vLLM words a prompt longer than ``max_model_len`` (vllm/renderers/params.py and
vllm/v1/engine/input_processor.py in 0.32; the older OpenAI-style wordings of earlier releases too).

- ``This model's maximum context length is 8192 tokens. However, your prompt contains [at least] 9001
  input tokens, which exceeds this limit even without any output tokens.``
- ``This model's maximum context length is 8192 tokens. However, your prompt contains 40000
  characters (more than …)`` — counted in characters, so no token figure.
- ``The decoder prompt (length 9001) is longer than the maximum model length of 8192.``
- before 0.10: ``… However, you requested 9001 tokens (…)`` / ``… your messages resulted in 9001 tokens``.
"""

from __future__ import annotations

import re

OVERFLOW_PATTERNS = (
    re.compile(
        r"maximum context length is (?P<context>\d+) tokens\. However, your prompt contains (?:at least )?"
        r"(?P<prompt>\d+) input tokens"
    ),
    re.compile(r"maximum context length is (?P<context>\d+) tokens\. However, your prompt contains \d+ characters"),
    re.compile(
        r"prompt \(length (?P<prompt>\d+)\) (?:plus the number of requested output tokens \(at least 1\) )?"
        r"is longer than the maximum model length of (?P<context>\d+)"
    ),
    re.compile(
        r"maximum context length is (?P<context>\d+) tokens\. However, (?:you requested|your messages resulted in) "
        r"(?P<prompt>\d+) tokens"
    ),
)
