"""What the user asked of a plan, typed once and handed to every engine.

``Pins`` are flags given explicitly (CLI, environment or gateway.toml): an engine evaluates exactly
those values and never varies them on its ladder. ``Policy`` adds the context bounds and which
engines may be planned. One object from the settings to every backend, for `plan` and `serve` alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.core.errors import ConfigError
from gateway.core.settings import AUTO as AUTO_CONTEXT  # context_length auto / -1
from gateway.core.settings import Settings

# A coding agent's first request is 20-30k tokens once a template renders its tools, and agents
# compact at ~85 % of the window: below 64k there is no room to work; 128k is room enough.
DEFAULT_MIN_CONTEXT = 65536
DEFAULT_TARGET_CONTEXT = 131072
LAST_RESORT_CONTEXT = 8192  # below the floor, a plan must still hold this much to be offered at all
# Without a GPU, serve at most this much context: long prompts are slow on a CPU anyway.
CPU_CONTEXT_CAP = 32768
FALLBACK_CONTEXT = 4096  # when neither the catalog nor the model's files say
# Agent sessions the plan keeps warm unless told (--sessions): one developer with two or three agents open,
# or one Claude Code session with a subagent or two, the prompt of each about AGENT_PROMPT_TOKENS.
DEFAULT_SESSIONS = 4
AGENT_PROMPT_TOKENS = 32768  # a working agent session's prompt: ~20k of tools and system prompt, then its turns


@dataclass(frozen=True)
class Pins:
    """Engine flags the user gave; None: the engine's ladder chooses. The context length is every
    engine's; the rest each engine declares itself (its ``PINS``) and reads back from ``engine``."""

    context_length: int | None = None  # the context every engine serves (vLLM --max-model-len, llama.cpp -c)
    context_auto: bool | None = None  # context_length auto / -1: the longest that fits, as vLLM fits it
    engine: Mapping[str, Any] = field(default_factory=dict)  # engine-declared pins given, by setting name

    @classmethod
    def from_values(cls, values: Settings) -> Pins:
        """The pins among the settings (whose class names its engines' pins in ``engine_pins``); a
        context length of -1 (auto) pins no length: every engine sizes the longest that fits. An
        engine setting counts when it differs from its default."""
        context, auto = values.context_length, None
        if context == AUTO_CONTEXT:
            context, auto = None, True
        declared = type(values).model_fields
        given = values.model_dump(include=set(values.engine_pins))
        engine = {
            name: given[name]
            for name in values.engine_pins
            if given[name] is not None and given[name] != declared[name].default
        }
        return cls(context, auto, engine)

    def __bool__(self) -> bool:
        """Whether any flag is pinned."""
        return self.context_length is not None or self.context_auto is not None or bool(self.engine)


@dataclass(frozen=True)
class Goal:
    """The context a plan aims for (gateway/backends/objective.py ranks by it): at least ``floor`` (a rung
    below it is a last resort, taken only when nothing reaches it, unless ``hard``: then it does not
    fit at all), and more up to ``target`` before anything else but stability."""

    floor: int = DEFAULT_MIN_CONTEXT
    target: int = DEFAULT_TARGET_CONTEXT
    hard: bool = False  # the floor was asked for (--min-context, a pinned context): nothing below it
    sessions: int = DEFAULT_SESSIONS  # agent sessions run at once and kept warm between their turns

    def warm_sessions(self, warm_tokens: int, context: int) -> tuple[int, int]:
        """(sessions kept warm at the full ``context``, at an agent's typical prompt): how many whole
        prompts ``warm_tokens`` (the engine's KV and its host prompt cache) hold."""
        typical = min(context, AGENT_PROMPT_TOKENS)
        return (warm_tokens // context if context else 0), (warm_tokens // typical if typical else 0)

    @property
    def least(self) -> int:
        """The shortest context that is planned at all: the floor when hard, else a last resort's."""
        return self.floor if self.hard else min(self.floor, LAST_RESORT_CONTEXT)

    def too_short(self, context: int) -> str | None:
        """Why ``context`` is not planned at all, or None."""
        if context >= self.least:
            return None
        if self.hard:
            return f"context {context:,} < the {self.floor:,} required"
        return f"context {context:,} < the {self.least:,} a last resort needs (the floor is {self.floor:,})"


@dataclass(frozen=True)
class Policy:
    min_context: int = DEFAULT_MIN_CONTEXT  # the floor
    max_context: int | None = None  # longest context worth reserving; None: the model's own limit
    engines: tuple[str, ...] | None = None  # plan only these engines; None: every registered one
    pins: Pins = field(default_factory=Pins)
    # the configuration remembered on this machine (known-good.json) with the engine's own measured
    # speed: a backend may calibrate its estimates on it (llama.cpp's host bandwidth term)
    remembered: dict[str, Any] | None = None
    target_context: int = DEFAULT_TARGET_CONTEXT
    hard_floor: bool = False  # min_context given (or a context pinned): nothing below it is a last resort
    sessions: int = DEFAULT_SESSIONS  # agent sessions at once (--sessions)
    # plan one engine over every node even where one node holds the model: the other shape that a plan of
    # replicas is weighed against (gateway/planning/replicas.py), never a decision of its own
    pool_nodes: bool = False
    # plan one rank of a group of this many engines on one node that share the model (a MoE's experts
    # spread over the ranks: vLLM's data parallelism), each rank on these devices; 1: an engine of its own
    data_parallel: int = 1

    @property
    def goal(self) -> Goal:
        return Goal(self.min_context, max(self.target_context, self.min_context), self.hard_floor, self.sessions)

    def plans(self, engine: str) -> bool:
        return self.engines is None or engine in self.engines


def policy_for(settings: Settings, limit: int | None, has_gpus: bool) -> Policy:
    """The policy `plan` and `serve` both use, from the settings and the model's own context limit.

    A pinned context length is the minimum too, unless ``min_context`` was given explicitly; without
    a pin the longest context is the model's limit, capped on a CPU (nothing to gain from 128k there).
    The floor and the target are the model's limit (or the cap) where that is smaller; a floor the
    user gave (or a pinned context) is hard, the default one soft (a last resort may go below it).
    """
    pins = Pins.from_values(settings)
    explicit_min = "min_context" in settings.model_fields_set
    engines = (settings.engine,) if settings.engine else None
    common: dict[str, Any] = {
        "engines": engines,
        "pins": pins,
        "hard_floor": explicit_min,
        "sessions": settings.sessions,
    }
    if pins.context_length is not None:
        if limit is not None and pins.context_length > limit:
            raise ConfigError(
                f"context_length {pins.context_length} exceeds the model's maximum of {limit}: "
                f"pass --context-length {limit} or less"
            )
        minimum = settings.min_context if explicit_min else pins.context_length
        common["hard_floor"] = True
        return Policy(min_context=minimum, max_context=settings.max_context, target_context=minimum, **common)
    top = settings.max_context or limit or FALLBACK_CONTEXT
    cap = top if has_gpus else min(top, CPU_CONTEXT_CAP)
    minimum = settings.min_context if explicit_min else min(settings.min_context, cap)
    target = min(settings.target_context or DEFAULT_TARGET_CONTEXT, cap)
    return Policy(min_context=minimum, max_context=cap, target_context=target, **common)
