"""Other machines: lending this node's devices to a head, and the head's survey of the lenders.

``worker`` (``gateway worker``) is engine-neutral: it starts one device server per device through
the registry's lender and answers ``/inventory`` behind the same key check as ``serve``; ``survey``
asks the workers, merges their devices into the inventory, and notices lost and returning nodes;
``pooled`` is the machine a plan pools (this node's devices with the others', or simulated ones).
Above serving (the worker's HTTP side uses its key check, limits and error shapes); the supervisor
gets a survey as its ``NodeWatch`` from ``gateway.cli.startup``.
"""
