"""One package per inference engine; each owns everything engine-specific.

Above ``gateway.core`` (devices, model entries and facts, policy, settings) and below the rest of the
gateway, which reaches the engines only through ``backends.registry``. A backend (the contract is
``backends.base``) reads its catalog table into model facts, turns facts + devices + policy into
candidates with memory terms and reasons, makes the fitting ones startable (argv, environment,
health path, log-line classification, step-down), and declares its own settings and pinned flags;
an engine that can lend a device to another node says how (``DeviceLender``). Engines run as
processes and are never imported.
"""
