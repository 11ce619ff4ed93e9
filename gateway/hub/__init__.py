"""A model named by hub id: its quantized variants found through ``huggingface_hub``, GGUF headers read
over range requests, the chosen files downloaded into the hub cache. Engine-neutral: which variant an
engine starts is the engine's choice (``backends/<engine>/``); reading a GGUF header remotely is
llama.cpp's (``backends/llamacpp/remote_gguf.py``). On ``gateway.core``, below ``backends``, which
use it."""
