"""Who a request belongs to, when it runs, and what it used: its session, key id and estimated prefill
(``sessions``), the scheduler that orders engine slots (``admission``), and the per key and session
figures for ``/metrics`` and ``/status`` (``usage_board``). On ``wire`` only."""
