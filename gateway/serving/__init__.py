"""The HTTP surface: routes, translations between API dialects, the edge, admission and the proxy.

Above supervision (it reads the served backend's state through ``supervision.lifecycle``); it
never names an engine.
"""
