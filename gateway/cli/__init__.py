"""The top layer: the commands (``serve``, ``plan``, ``gpus``, ``worker``, ``agent``).

``commands`` parses and dispatches (thin), ``flags`` generates every flag from the settings
declarations, ``startup`` is serve's assembly (settings → plan → options → supervisor and route).
The only package that wires planning, supervision and serving together.
"""
