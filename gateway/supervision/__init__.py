"""Supervision: starting the chosen option, watching it, stepping down, restarting, reaping.

Above ``gateway.core``, ``backends`` and ``gateway.nodes``; it never plans and never serves HTTP.
"""
