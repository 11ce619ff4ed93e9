"""The bottom layer: the vocabulary the engines and the rest of the gateway share.

``devices`` (the machine: local GPUs, other nodes' devices, host RAM; one JSON for a device),
``model_entry`` (a catalog entry as typed data), ``policy`` (what the user pinned, context bounds),
``settings`` (the gateway's generic settings; each engine adds its own), ``errors`` (and ``shown``:
an outside value cut to one line of a message), ``auth`` (the one API-key check, the Bearer header),
``files`` (atomic writes), ``process`` + ``reaper`` (a child in its own process group with an explicit
environment, which cannot outlive the gateway), ``tls`` (the HTTP clients' one TLS context). Imports
nothing from ``gateway.backends`` or above; what only the engines read (model facts, checked numbers from
their files, bandwidths) is at the top of ``gateway.backends``.
"""
