"""A model named by hub id, and every read of the hub: the repositories the hub lists for it
(``search``: its quantized children, its organisation's, the publishers an engine trusts) and the
chosen files downloaded into the hub cache (``fetch``), each through ``guard`` (hooks on
huggingface_hub's client: origins, names, byte and time caps), with ``names`` (repository ids and
listed file names checked) and ``errors`` (the hub's failures as one line naming the fix).
Engine-neutral: which repositories hold something an engine loads, and which of those it starts, is
the engine's (``gateway/backends/llamacpp/hub_gguf.py``, ``gateway/backends/vllm/hub_checkpoints.py``). On
``gateway.core``, below ``gateway.backends``, which use it."""
