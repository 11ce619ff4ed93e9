"""gateway: one OpenAI- and Anthropic-compatible URL in front of your own GPUs (or CPU).

The package's folders are its layers, and ``LAYERS`` below is the one place their order is written:
``tests/unit/test_layers.py`` reads it (every import points down it; packages on one level do not import
each other) and ``docs/architecture.md``'s diagram is drawn from it (a test compares the two). Nothing
outside ``gateway.backends`` names an engine outside a docstring: it asks ``gateway.backends.registry``.
"""

__version__ = "0.1.0"

# Bottom first; the packages of one tuple sit on one level. Each package's docstring says what it holds.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),  # the vocabulary: devices, model entries, policy, settings, errors, files, processes
    ("hub",),  # a model named by hub id, and every read of the hub
    ("backends",),  # one package per engine behind one contract
    ("agents",),  # what each coding agent needs to point at the gateway
    ("remembered",),  # what started here, which planning and supervision both read
    ("planning", "supervision"),  # which engine and options fit; starting them, stepping down, restarting
    ("serving",),  # the HTTP surface over the served backend
    ("nodes",),  # lending devices to another node, surveying the nodes that lend
    ("cli",),  # the commands, which wire the layers together
)


def layer_diagram() -> str:
    """The layers drawn top first, as docs/architecture.md shows them."""
    return "\n".join(" · ".join(f"gateway/{name}/" for name in level) for level in reversed(LAYERS))
