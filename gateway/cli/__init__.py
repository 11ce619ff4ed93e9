"""The commands (``gateway serve``, ``plan``, ``worker``, ``agent``) and serve's assembly.

The top layer: it wires planning, supervision and serving together and holds no logic of its own.
"""
