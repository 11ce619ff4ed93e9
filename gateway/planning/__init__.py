"""Planning: which model, which engine, which options fit the devices, and the plan report.

Above ``gateway.core`` and ``backends`` (it asks the registry for each engine's candidates);
nothing here starts a process or serves a request.
"""
