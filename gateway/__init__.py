"""gateway: one OpenAI- and Anthropic-compatible URL in front of your own GPUs (or CPU).

The package is layered, bottom first, and every import points down (``tests/unit/test_layers.py``):

- ``gateway.core``: the vocabulary (devices, model entries and facts, policy, settings, errors,
  auth, files, child processes). ``backends`` sits on it: one package per engine.
- ``gateway.agents``: what each coding agent needs to point at the gateway.
- ``gateway.planning`` (which engine, which options fit) and ``gateway.supervision`` (start them,
  step down, restart): side by side, neither imports the other.
- ``gateway.serving``: the HTTP surface over the served backend.
- ``gateway.nodes``: lending devices to another node (the worker serves HTTP with the serving
  layer's parts) and surveying the nodes that lend.
- ``gateway.cli``: the commands, which wire the layers together.

Nothing in ``gateway`` names an engine outside a docstring: it asks ``backends.registry``.
"""

__version__ = "0.1.0"
