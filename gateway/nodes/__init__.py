"""Other machines: the worker that lends this machine's devices, and the survey of the workers.

Beside the planning and supervision layers, above ``gateway.core`` and ``backends``.
"""
