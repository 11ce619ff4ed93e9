"""`gateway agent NAME`: the exact configuration each coding agent needs for a running gateway.

``configs`` asks the gateway and renders each agent's configuration in the agent's own format (so pointing
an agent at the gateway is one command); ``write`` merges it into the files the agent reads (``--write``).
"""

from gateway.agents.configs import AGENTS, AgentConfig, Served, Target, ask
from gateway.agents.write import write

__all__ = ["AGENTS", "AgentConfig", "Served", "Target", "ask", "write"]
