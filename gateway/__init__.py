"""gateway: one OpenAI-compatible URL in front of your own GPUs (or CPU)."""

__version__ = "0.1.0"
