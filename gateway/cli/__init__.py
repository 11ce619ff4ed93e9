"""The top layer: the commands (``serve``, ``plan``, ``gpus``, ``worker``, ``agent``).

``commands`` parses and dispatches (thin), ``full_settings`` mixes every engine's settings into the
gateway's, ``flags`` generates every flag from those declarations, ``startup`` wires serve's parts
(keys → the nodes → the plan from ``gateway.planning.serve_plan`` → supervisor, client and runtime).
The only package that wires planning, supervision, serving and the nodes together.
"""
