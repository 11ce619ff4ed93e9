"""Which replica a request goes to when more than one engine serves the model: each conversation to the
replica that holds its cache (``pool``: the replicas, their state and load, the sessions bound to them),
named by what the agents send (``affinity``: a conversation and the ones it descends from), bindings
kept in bounded memory (``bindings``), a request that sent nothing to its client yet tried again on
another replica when its own fails (``retry``), and each replica's time to first output in bounded
memory (``ttft``). Above ``scheduling`` (a replica's prefix estimate) and ``wire``; with one replica it
is never asked anything."""
