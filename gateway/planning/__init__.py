"""Planning: which model, which engine, which options fit the devices, and the plan report.

``catalog`` resolves what the user typed to an entry (asking each engine which files and hub ids it
can load), ``planner`` asks each registered engine for its candidates and picks, ``from_settings``
makes a plan from the user's settings (installations, policy, the remembered calibration),
``serve_plan`` turns it into the options `serve` tries in order, ``remembered_repair`` puts the
remembered configuration first or sets it aside where it no longer holds, ``plan_report`` prints and
serializes the plan.
Above ``gateway.core`` and ``gateway.backends``; nothing here starts a process or serves a request.
"""
