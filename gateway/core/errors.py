"""The gateway's own exceptions, one tree; the CLI prints each as one line that names the fix.

GatewayError
├── ConfigError        a setting, flag or config file is wrong
├── ModelError         the model cannot be resolved or its files cannot be had
└── BackendError       an engine cannot be started or died while starting
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base class: the message is meant for the user, complete and actionable."""


class ConfigError(GatewayError):
    pass


class ModelError(GatewayError):
    pass


class BackendError(GatewayError):
    pass


def shown(value: object, limit: int = 60) -> str:
    """``value`` (a name or number from a user, a file or the hub) short enough for one line of an error:
    its repr, cut at ``limit`` characters with its full length when longer."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
