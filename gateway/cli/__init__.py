"""The top layer: the commands (``serve``, ``plan``, ``gpus``, ``worker``, ``agent``).

``commands`` parses and dispatches (thin), ``full_settings`` mixes every engine's settings into the
gateway's, ``flags`` generates every flag from those declarations, ``startup`` is serve's assembly
(settings → plan → options → supervisor and route). The only package that wires planning,
supervision and serving together.
"""
