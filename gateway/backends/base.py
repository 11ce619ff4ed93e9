"""The engine seam: what every backend implements, and what it hands the planner and the supervisor.

A backend (``gateway/backends/<engine>/``) turns a catalog entry into engine-specific model facts, those
facts plus the machine and the policy into candidates (memory terms, reasons, argv), fitting
candidates into startable options, and its engine's log lines into classified failures. The
gateway asks :mod:`gateway.backends.registry` and never names an engine."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

if TYPE_CHECKING:
    from gateway.backends.objective import Traits
    from gateway.backends.server_host import ServerHost
    from gateway.core.devices import Device, Inventory
    from gateway.core.model_entry import ModelEntry
    from gateway.core.policy import Policy
    from gateway.core.settings import Settings


class Capability(enum.StrEnum):
    """What an engine does itself, so that the gateway does not redo it (``Launch.native``); the values are
    ``--backend-native-apis``' words, and RESPONSES/MESSAGES also the routes ``/v1/<value>``."""

    RESPONSES = "responses"
    MESSAGES = "messages"
    INCLUDE_USAGE = "include_usage"  # sends the usage chunk a stream asks for
    MAX_COMPLETION_TOKENS = "max_completion_tokens"  # reads it (else the gateway renames it max_tokens)
    OPENAI_SHAPES = "openai_shapes"  # answers in OpenAI's exact shapes (else the gateway completes them)
    STREAM_KEEPALIVE = "stream_keepalive"  # its connections stay usable after a stream (llama-server's do not)


@dataclass(frozen=True)
class LongPin:
    """Where a long prefill goes, decided as it is sent rather than in the plan. The engine's ``path`` page is
    read until ``place`` (its text; the gateway's other requests holding the engine's slots; the tokens of
    the prompt the engine likely holds, by the gateway's estimate) gives the fields the request carries, {}
    for none, or None for not yet (read again, up to ``wait_s``; then it goes with none). From the read that
    places it until ``taken`` (the page; those fields) shows the engine holds it, the gateway sends the
    engine nothing else: no other request can take the place first."""

    path: str
    place: Callable[[str, int, int], Mapping[str, Any] | None]
    taken: Callable[[str, Mapping[str, Any]], bool]
    wait_s: float = 30.0
    primer: Primer | None = None


@dataclass(frozen=True)
class Primer:
    """A request the engine runs in a place just before a long prefill is pinned there, where the place
    function asks for one (the fields it gives carry ``marker``, taken out before they are sent): ``body``
    from those fields, sent to ``path`` while the gateway sends the engine nothing else. llama-server: a few
    tokens in its empty last slot, so that a prompt pinned there next is looked up in the host-RAM cache
    (pinned to an empty slot it is not: gateway.backends.llamacpp.scheduling)."""

    marker: str
    path: str
    body: Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class PrefillFirst:
    """A long prefill the gateway runs ahead of its request, as a request of its own that it can pause while
    warm turns run: the engine keeps what a cancelled request prefilled, and the same prompt sent again
    resumes there (gateway.serving.transport.prefill_first). ``fields`` turn a copy of the request's body
    into that prefill (one token, streamed with an event per batch so that a cancel lands within one);
    ``drop`` are taken out of it; ``paths``: the routes whose bodies it applies to; ``progress``: the prompt's
    tokens, those the engine found held and those done so far, from the last progress event in some bytes
    of its stream (None: none there); ``resume``: where a paused prefill is sent again, from the engine's ``path``
    page and the tokens it had done ({}: wherever the engine puts it)."""

    fields: Mapping[str, Any]
    drop: tuple[str, ...]
    paths: frozenset[str]
    progress: Callable[[bytes], tuple[int, int, int] | None]
    path: str
    resume: Callable[[str, int], Mapping[str, Any]]


@dataclass(frozen=True)
class Scheduling:
    """What the engine can do for many sessions at once, as the gateway's admission uses it
    (gateway.serving.scheduling.admission): how many long prefills it runs at once without starving the short
    turns beside them, and what a long prefill's request carries to be served after short ones."""

    long_lane: int = 0  # long prefills in the engine at once; 0: no limit (the engine interleaves them itself)
    long_fields: Mapping[str, Any] = field(default_factory=dict)  # added to a long prefill's request body
    long_pin: LongPin | None = None  # more fields, read from the engine as a long prefill is sent
    prefill_first: PrefillFirst | None = None  # a long prefill paused while warm turns run, where it can be
    means: str = ""  # one line for the plan and /status: what the engine itself does for many sessions


@dataclass(frozen=True)
class Follower:
    """One rank of an engine group on another node, as the head asks that node's worker to start it:
    the worker puts its own command for ``engine`` in front of ``args`` and refuses another version."""

    node: str  # the node's name as its worker reports it
    rank: int
    engine: str
    version: str  # the head's version of the engine; the worker runs only the same
    args: tuple[str, ...]  # the engine's arguments after its command, the group's own included


@dataclass(frozen=True)
class Launch:
    """A fully decided engine start: the supervisor runs ``argv`` with ``env`` added and polls health."""

    engine: str  # the backend's name ("external" for --backend-url)
    argv: list[str]
    port: int
    api_key: str
    served_name: str  # the model name the engine answers to
    context_length: int
    health_path: str
    summary: str  # one line for the console: what is being started and with what
    env: dict[str, str] = field(default_factory=dict)
    # the engine's own families of variables kept from the gateway's environment (its tuning knobs),
    # beside the few every child gets (gateway.core.process.child_environment)
    inherit: tuple[str, ...] = ()
    max_concurrency: int = 1  # requests the engine runs at once (vLLM max_num_seqs, llama.cpp slots)
    native: frozenset[Capability] = frozenset()  # what the engine does itself (:class:`Capability`)
    reasoning_field: str | None = None  # the one of reasoning / reasoning_content the engine emits
    tokenize_path: str | None = None  # counts tokens: POST {tokenize_key: text} → {"count": n}
    tokenize_key: str = "input"
    # a chat request's exact prompt (its chat template, tools included), so the gateway never counts on a
    # guess: the tokenize endpoint takes the chat itself (vLLM), or template_path renders it to text first
    # (llama-server's /apply-template: POST {messages, tools} → {"prompt": text}); neither: estimated
    tokenize_chat: bool = False
    template_path: str | None = None
    base: str | None = None  # a server somewhere else (--backend-url); launched engines are on loopback
    # reads the engine's own account of its memory from one log line: (device, term, bytes) or None
    memory_line: Callable[[str], tuple[str, str, int] | None] | None = None
    # reads the engine's own timings from one log line: ("prompt" | "decode", tokens, seconds), or
    # ("draft", accepted, drafted) where speculative decoding reports its acceptance, or None
    speed_line: Callable[[str], tuple[str, int, float] | None] | None = None
    # or from its metrics page (GET metrics_path while it serves): {"prompt" | "decode": (tokens, seconds)},
    # its totals so far, for an engine whose log has no per-request timings (vLLM)
    speed_metrics: Callable[[str], dict[str, tuple[float, float]]] | None = None
    metrics_path: str = "/metrics"
    scheduling: Scheduling = field(default_factory=Scheduling)
    # fields the gateway adds to a request that leaves them out: the model's recommended sampling, for an
    # engine that takes no server-wide sampling defaults (llama-cpp-python); empty where the engine has them
    request_defaults: Mapping[str, Any] = field(default_factory=dict)
    # the engine's own account of work done, for the progress watch (gateway.supervision.liveness): GET
    # progress_path while requests are in flight, and ``progress`` reads it (None when the text says
    # nothing usable). None: the engine reports nothing, only relayed chunks count.
    progress_path: str | None = None
    progress: Callable[[str], Progress | None] | None = None
    # the ranks of one engine group that run on other nodes (vLLM across nodes): started there by their
    # workers, stopped with this start; empty: this process is the whole engine
    followers: tuple[Follower, ...] = ()

    @property
    def base_url(self) -> str:
        return self.base or f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Progress:
    """An engine's own account of its work at one moment."""

    mark: Hashable  # changes whenever the engine did work (prompt tokens processed, tokens generated, a step)
    # whether it has a request to work on, where the page is written by the loop that works (None: unknown,
    # or a figure that stops being updated when that loop hangs); False: what is in flight waits on the
    # network or a slow client, not on the engine
    busy: bool | None = None
    # each part of the engine's work that must move on its own while busy (a llama-server slot), as (its name,
    # its mark), the busy ones only: one that stands still while the others move is stuck all the same (a
    # slot spinning on a corrupted prompt, its request waiting for ever while the engine serves the rest)
    parts: tuple[tuple[Hashable, Hashable], ...] = ()


@dataclass(frozen=True)
class ContextOverflow:
    """An engine's refusal of a prompt that does not fit its context, with the numbers it gave (an
    engine that gives none leaves them None). Agents recognise one canonical wording per dialect, so
    the gateway rewrites every engine's own words into it."""

    prompt_tokens: int | None
    context_length: int | None


# each pattern matches one engine wording; its groups are named ``prompt`` and ``context`` when present
OverflowPatterns = Sequence[re.Pattern[str]]


def first_overflow(patterns: OverflowPatterns, text: str) -> ContextOverflow | None:
    """The overflow the first matching pattern proves, with whichever numbers it captured."""
    for pattern in patterns:
        if match := pattern.search(text):
            found = match.groupdict()
            prompt, context = found.get("prompt"), found.get("context")
            return ContextOverflow(int(prompt) if prompt else None, int(context) if context else None)
    return None


class FailureKind(enum.Enum):
    """Why an engine did not come up. Memory kinds are stepped down from; the others are not."""

    WEIGHTS_OOM = "out of memory while loading weights"
    KV_TOO_SMALL = "KV cache smaller than one max-length request"
    NO_KV_MEMORY = "no memory left for the KV cache"
    FREE_BELOW_UTILIZATION = "free memory below the requested utilization"
    KV_EXCEEDS_FREE = "requested KV cache larger than free memory"
    OUT_OF_MEMORY = "out of memory"
    MAX_LEN_OVER_LIMIT = "max model length above the model's limit"
    BAD_ARGUMENT = "bad argument"
    MODEL_FILE = "model file missing or corrupt"
    PORT_IN_USE = "port in use"
    DEVICE_UNREACHABLE = "a device on another machine cannot be reached"
    ENGINE_FAILED = "engine failed to start"

    @property
    def is_memory(self) -> bool:
        return self in _MEMORY

    @property
    def is_configuration(self) -> bool:
        """Retrying cannot help: the user must change something (the fix says what)."""
        return self in (FailureKind.MAX_LEN_OVER_LIMIT, FailureKind.BAD_ARGUMENT, FailureKind.MODEL_FILE)


_MEMORY = {
    FailureKind.WEIGHTS_OOM,
    FailureKind.KV_TOO_SMALL,
    FailureKind.NO_KV_MEMORY,
    FailureKind.FREE_BELOW_UTILIZATION,
    FailureKind.KV_EXCEEDS_FREE,
    FailureKind.OUT_OF_MEMORY,
}


@dataclass(frozen=True)
class Failure:
    """A failure recognised in an engine's log line, with the numbers the engine printed."""

    kind: FailureKind
    line: str
    fix: str
    numbers: dict[str, float] = field(default_factory=dict)


def most_telling(failures: Sequence[Failure]) -> Failure | None:
    """The failure a run reports: the first specific one, else the first generic one."""
    specific = [f for f in failures if f.kind is not FailureKind.ENGINE_FAILED]
    ranked = specific or failures
    return ranked[0] if ranked else None


# (pattern, kind, fix): the pattern's groups are the numbers the engine printed, in the order named
FailurePatterns = Sequence[tuple[re.Pattern[str], FailureKind, str]]


def first_failure(
    patterns: FailurePatterns, line: str, number_names: Mapping[FailureKind, tuple[str, ...]] | None = None
) -> Failure | None:
    """The failure the first matching pattern proves, with its captured numbers named."""
    for pattern, kind, fix in patterns:
        if match := pattern.search(line):
            values = [float(group.replace(",", "")) for group in match.groups()]
            names = (number_names or {}).get(kind, ())
            return Failure(kind=kind, line=line.strip(), fix=fix, numbers=dict(zip(names, values, strict=False)))
    return None


class Option(Protocol):
    """One startable configuration of one engine: what the supervisor starts, retries and remembers.

    Each backend's option knows how to launch itself, read its engine's log lines, and step down on
    the engine's own numbers; the supervisor only orders them.
    """

    @property
    def engine(self) -> str: ...
    @property
    def label(self) -> str: ...  # one line for logs and /status
    @property
    def weights_key(self) -> tuple[object, ...]: ...  # equal keys load the same weights per device
    @property
    def context_length(self) -> int: ...
    @property
    def estimated_tokens_per_s(self) -> float: ...  # the plan's decode estimate (0: none), beside the measured
    def launch(self, port: int, api_key: str) -> Launch: ...
    def classify(self, line: str) -> Failure | None: ...
    def step_down(self, failure: Failure) -> Option | None: ...  # the same option adjusted to the engine's numbers
    def memo(self) -> dict[str, Any]: ...  # what to remember when it worked
    def prepare(self) -> Option: ...  # blocking work before a start (e.g. fetching a file)
    # a remembered configuration on this option; every field it takes is checked here (KeyError, TypeError or
    # ValueError on a memo of the wrong shape), so that a bad one is found before the engine is launched
    def from_memo(self, memo: dict[str, Any]) -> Option: ...


@dataclass(frozen=True)
class Installation:
    """How an engine would be started on this machine, and the version its plan is made for."""

    command: tuple[str, ...] | None  # argv prefix that starts its server; None: not installed
    version: str  # what the plan assumes ("unknown" when nothing says)
    version_source: str  # "installed", "given", or why it is assumed
    build: str = ""  # which build or launcher: "cpu" (vLLM's CPU build), "native"/"python" (llama.cpp)
    missing: str = ""  # when not installed: the one-line fix (what to install or set), for `serve`'s error


class Candidate(Protocol):
    """One evaluated configuration of one engine: fits or not, with the reason in numbers."""

    fits: bool
    reason: str
    argv: list[str]  # with PORT/KEY placeholders, for `gateway plan`
    env: dict[str, str]

    @property
    def engine(self) -> str: ...
    @property
    def label(self) -> str: ...  # what it is, for the decision line ("vLLM TP2, util 0.95, 8 seqs")
    @property
    def headline(self) -> str: ...  # the decision's figures: checkpoint or file, TP or split, context, KV…
    @property
    def context_length(self) -> int: ...
    @property
    def kv_tokens(self) -> int: ...  # tokens the KV cache holds (0 when the engine does not say)
    @property
    def at_once(self) -> int: ...  # requests the engine runs at once (vLLM max_num_seqs, llama.cpp slots)
    @property
    def warm_tokens(self) -> int: ...  # prompt tokens kept between turns (KV, and a host prompt cache)
    @property
    def traits(self) -> Traits: ...  # what it gives and gives up, as the one objective ranks (objective.py)
    @property
    def sampling_line(self) -> str: ...  # the recommended sampling, where it came from, how the engine applies it
    @property
    def devices(self) -> tuple[Device, ...]: ...  # what memory_terms' device positions name, in the engine's order
    @property
    def nodes(self) -> tuple[str, ...]: ...  # the other nodes it also runs on (pipeline stages, RPC devices)
    @property
    def ranks(self) -> int: ...  # engines of one group it is a rank of, stepping together (1: an engine of its own)
    def memory_terms(self) -> list[tuple[int, str, int]]: ...  # (position in devices, term, bytes) for /metrics
    # estimated tokens/s of that many requests decoding at once (0: not estimated): the weights read once
    # per step for all of them, each one's cache, the link to other nodes where it crosses one
    def decode_rate(self, sequences: int) -> float: ...
    def to_json(self) -> dict[str, Any]: ...


class ModelFiles(Protocol):
    """What one engine read about a model (checkpoints, a GGUF…), with why parts are missing."""

    @property
    def max_position(self) -> int | None: ...  # the model's own context limit, when its files say
    @property
    def notes(self) -> list[str]: ...  # what reading them found worth saying (the plan's notes)


C = TypeVar("C", bound=Candidate)
M = TypeVar("M", bound=ModelFiles)


@dataclass(frozen=True)
class Evaluation(Generic[C]):
    """What :meth:`Backend.candidates` found: every rung, fitting or not, and what the plan should say
    of them. The model it was given is left as it was; an engine that chooses something on the way
    that its options need (a GGUF quantization, the tool parsers) returns a subclass that carries it,
    and :meth:`Backend.options` gets this object back."""

    candidates: list[C] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # beside the model's own, in the order found


E = TypeVar("E", bound=Evaluation[Any])
# an engine's own settings class (``Backend.settings_model``): the gateway's whole settings class derives
# from every engine's, so each engine reads its own fields, typed, from the object the gateway passes
S = TypeVar("S", bound=BaseModel, covariant=True)
Own = TypeVar("Own", bound=BaseModel)


def own_settings(model: type[Own], settings: Settings) -> Own:
    """The engine's own settings (``model``) out of the gateway's: the same object where its class derives
    from ``model`` (the gateway's full settings do), else its fields read one by one (those it lacks at
    their defaults), validated either way, so the engine's code reads a typed object and no cast."""
    return model.model_validate(settings, from_attributes=True)


@dataclass
class NewNotes:
    """The notes an evaluation adds to those its model already has (``said``), each once, in order."""

    said: Sequence[str] = ()
    lines: list[str] = field(default_factory=list)

    def add(self, note: str | None) -> None:
        if note and note not in self.said and note not in self.lines:
            self.lines.append(note)


class Backend(Protocol[C, M, E, S]):
    """One engine. Methods are pure unless they say otherwise (none changes its arguments); the
    registry holds one of each. Those that take ``settings`` get the gateway's whole settings object
    and read their own from it with :func:`own_settings` (``settings_model`` declares which)."""

    name: str  # catalog table, JSON "backend", Launch.engine
    title: str  # for people: "vLLM"
    needs: str  # what planning needs from the model, said when it has none ("" : the generic words)

    @property
    def settings_model(self) -> type[S]:
        """This engine's own settings (fields with help and flags), mixed into the gateway's settings;
        the methods below get that whole settings object and read their own fields from it."""
        ...

    @property
    def model_files(self) -> tuple[str, ...]:
        """The endings of the single files it loads a whole model from (``--model FILE``)."""
        ...

    @property
    def pins(self) -> tuple[str, ...]:
        """Those of its settings that pin one of its flags (the policy carries them, as given)."""
        ...

    @property
    def file_pins(self) -> tuple[str, ...]:
        """Those of its pins that choose which of a model's files it loads (a hub quantization): while
        one is given, a configuration remembered for other files is not reused."""
        ...

    @property
    def overflow_patterns(self) -> OverflowPatterns:
        """How its servers refuse a prompt longer than the context (``gateway/backends/<engine>/overflow.py``)."""
        ...

    @property
    def lender(self) -> DeviceLender | None:
        """How it serves this node's devices to a head on another node (``gateway worker``); None:
        it lends none."""
        ...

    @property
    def follower_host(self) -> FollowerHost | None:
        """How a worker runs one rank of its engine group for a head on another node; None: it runs
        no ranks for others."""
        ...

    @property
    def server_host(self) -> ServerHost | None:
        """How a worker runs a whole server of this engine for a head on another node (a replica there);
        None: it runs none for others."""
        ...

    def section_for(self, spec: str) -> dict[str, Any] | None:
        """A catalog table for a model the user named by path or hub id, if this engine can serve it."""
        ...

    def parse_section(self, table: dict[str, Any]) -> Any:
        """The entry's ``[<name>]`` table as this engine's typed source (raises ValueError)."""
        ...

    def installation(self, settings: Settings, *, probe: bool) -> Installation:
        """Where its server is and which version; ``probe`` may run the engine's command to ask
        (serve), otherwise only package metadata is read (plan). Never imports the engine."""
        ...

    def read(self, entry: ModelEntry) -> M:
        """The model's facts as this engine sees them (I/O: local files, the hub's config, a package)."""
        ...

    def candidates(self, model: M, inventory: Inventory, policy: Policy, installation: Installation) -> E:
        """Every rung of this engine's ladder, fitting or not, each with its reason, and the notes
        they call for; what the engine chose on the way travels in the result, not in ``model``."""
        ...

    def ranked(self, candidates: list[C]) -> list[C]:
        """The fitting candidates, best first by the one objective (``gateway/backends/objective.py``)."""
        ...

    def summary(self, candidates: list[C], chosen: object) -> list[str]:
        """A few lines for ``gateway plan``: one per checkpoint × TP or per quantization, each its
        best candidate or its one reason; ``chosen`` is marked."""
        ...

    def rows(self, candidates: list[C], chosen: object) -> list[str]:
        """The full report of its candidates (``gateway plan --verbose``); ``chosen`` is marked."""
        ...

    def options(
        self, model: M, found: E, policy: Policy, installation: Installation, settings: Settings
    ) -> list[Option]:
        """What the supervisor may start of what :meth:`candidates` ``found``, best first. Empty when
        nothing fits, and when the engine is not installed (``installation.command`` None): it never
        raises for that, so another engine's options still serve, and ``serve`` says
        ``installation.missing`` when no engine has any."""
        ...

    def memo_version(self, installation: Installation) -> str:
        """The version a remembered configuration is valid for."""
        ...

    def device_env(self, devices: Sequence[Device]) -> dict[str, str]:
        """What one of its processes needs in its environment to see only ``devices`` of its node (a
        replica on part of a node's GPUs; each device by its index on that node)."""
        ...

    def cpu_env(self, cores: Sequence[int]) -> dict[str, str]:
        """What one of its processes needs in its environment to compute on ``cores`` alone (one of several
        CPU replicas on one machine, each given its share); {} where its thread count is enough."""
        ...

    def rank_headers(self, rank: int) -> dict[str, str]:
        """What a request carries to be served by ``rank`` of a group this engine runs as one process (a
        session kept on the rank that holds its cache); {} for an engine that runs no such group."""
        ...


class DeviceLender(Protocol):
    """How an engine serves one of this node's devices to a head on another node (``gateway worker``):
    one server process per device, each on its own port. The worker around it is generic."""

    server_name: str  # the server's name in logs and messages ("ggml-rpc-server")
    default_port: int  # the first device's port; the others take the next ones
    env: Mapping[str, str]  # added to each server's environment
    inherit: tuple[str, ...]  # the engine's own variable families kept from the worker's environment
    missing: str  # the one-line fix when no server command is found
    port_flags: tuple[str, ...]  # `gateway worker`'s flags for the first server port, as users know them
    command_flags: tuple[str, ...]  # and for the server command

    def command(self, configured: Sequence[str] | None) -> list[str] | None:
        """The server to run: ``configured``, else the one installed (None: none found)."""
        ...

    def server_argv(
        self, command: Sequence[str], *, host: str, port: int, local_gpu: int | None, threads: int | None
    ) -> list[str]:
        """One server for one device bound to ``host`` (``local_gpu``: its NVML index; None: the CPU)."""
        ...

    def protocol_version(self, line: str) -> str | None:
        """The wire protocol a server's log line announces (head and workers must speak the same)."""
        ...

    def build(self) -> str:
        """The engine build this node runs, as the head and the workers compare it."""
        ...


class FollowerHost(Protocol):
    """How a worker runs one rank of an engine group that a head leads (``gateway worker``): the
    command comes from the worker's own installation of the engine, the arguments from the head."""

    engine: str  # the backend's name, as in :class:`Follower`
    title: str
    inherit: tuple[str, ...]  # the engine's own variable families kept from the worker's environment

    def argv(self, command: Sequence[str], args: Sequence[str]) -> list[str]:
        """The follower's full command line: ``command`` (this node's engine) and the head's ``args``."""
        ...

    def env(self, host_ip: str, interface: str) -> dict[str, str]:
        """What the follower needs to be reached by the other ranks: this node's address as they reach
        it and the network interface it is on."""
        ...
