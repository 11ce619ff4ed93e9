"""A model named by hub id: the repositories the hub lists for it (``search``: its quantized children,
its organisation's, the publishers an engine trusts) and the chosen files downloaded into the hub cache
(``fetch``). Engine-neutral: which repositories hold something an engine loads, and which of those it
starts, is the engine's (``backends/llamacpp/hub_gguf.py``, ``backends/vllm/hub_checkpoints.py``). On
``gateway.core``, below ``backends``, which use it."""
