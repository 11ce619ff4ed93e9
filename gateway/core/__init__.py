"""The bottom layer: the vocabulary the engines and the gateway share.

Devices, model facts, what the user pinned (policy), errors, settings, atomic files. It imports
nothing from ``backends`` or from any layer above it, so every other package can lean on it.
"""
