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
