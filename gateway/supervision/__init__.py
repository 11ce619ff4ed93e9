"""Supervision: starting the chosen options, watching them, stepping down, restarting.

``supervisor`` owns the attempts (step-down on the engine's own numbers, fallback to the next option,
restarts, re-plans when a node is lost) with its pure decisions in ``after_failure``; ``engine_run`` is one
start of one engine (process, health, failure lines); ``lifecycle`` is the contract the HTTP side reads
(state, launch, readiness). What worked is remembered in ``gateway.remembered``. Above ``gateway.core``
and ``gateway.backends``; the other nodes it watches come in as a ``NodeWatch`` (``gateway.nodes`` sits
higher). It never plans and never serves HTTP.
"""
