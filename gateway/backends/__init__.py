"""One package per inference engine; each owns everything engine-specific.

Above ``gateway.core`` (devices, model entries, policy, settings) and ``gateway.hub``, and below the
rest of the gateway, which reaches the engines only through ``gateway.backends.registry``. A backend (the
contract is ``gateway.backends.base``) reads its catalog table into model facts, turns facts + devices +
policy into candidates with memory terms and reasons, makes the fitting ones startable (argv,
environment, health path, log-line classification, step-down), and declares its own settings and
pinned flags; an engine that can lend a device to another node says how (``DeviceLender``). Beside
the engines, what they all read: ``model_facts`` (what every engine plans from, from config.json),
``checked`` (numbers and JSON from files someone else wrote), ``bandwidth`` (a device's memory
bandwidth, for the speed estimates), ``hub_formats`` (which engine's files a hub repository holds),
and ``objective`` (the one ranking). Engines run as processes and are never imported.
"""
