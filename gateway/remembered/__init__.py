"""Remembered configurations: what started on this machine, per model, kept across runs.

``known_good`` is the store (one JSON file in the state directory, read as input that may have gone
bad) and the slot one model on one machine has in it. Below both ``gateway.planning`` (which puts the
remembered configuration first, or repairs it) and ``gateway.supervision`` (which remembers what
started, and how fast it ran): neither asks the other for it.
"""
