"""One settings object for the whole gateway.

Precedence, highest first: CLI flags (passed in as keyword arguments) > environment variables
(``GATEWAY_*``) > a ``gateway.toml`` file > the defaults declared here. Each field is declared once,
with its help text, so the CLI, the environment and the TOML file all speak the same names.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gateway.core.errors import ConfigError
from gateway.core.files import read_regular_file

DEFAULT_CONFIG_FILE = Path("gateway.toml")
MAX_KEY_FILE_BYTES = 1024 * 1024  # a key per line: thousands of keys fit


def _default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gateway"


class Settings(BaseSettings):
    """What a user can set that is no engine's own. Field names are the TOML keys; ``GATEWAY_<NAME>``
    the env vars. Each engine declares its own settings (``Backend.settings_model``); the gateway's
    full settings class is this one with theirs mixed in (:mod:`gateway.cli.full_settings`)."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="forbid")
    engine_pins: ClassVar[tuple[str, ...]] = ()  # the engines' settings that pin one of their flags
    # of those, the ones that choose which of a model's files an engine loads (Backend.file_pins)
    file_pins: ClassVar[tuple[str, ...]] = ()

    host: str = Field("127.0.0.1", description="Address the gateway listens on (0.0.0.0 in containers).")
    port: int = Field(8000, ge=1, le=65535, description="Port the gateway listens on.")
    model: str | None = Field(
        None,
        description="Catalog name or alias, hub repo id, a model file or a checkpoint directory. "
        "Unset on a machine without GPUs: the embedded default model.",
    )
    context_length: int | None = Field(
        None,
        description="Context length to serve (pinned: every engine's context flag); unset: the model's "
        "maximum, capped at 32768 without a GPU.",
        json_schema_extra={"flags": ["--context-length", "--max-model-len"], "parse": "count_or_auto"},
    )
    gpus: str | None = Field(
        None,
        description="Simulate GPUs instead of asking NVML: 2x32GiB, 1x12GiB,1x24GiB, 2x32GiB@12.0, 1x24GiB:free=20GiB "
        "(`plan` and `gpus` show a machine you do not have; a worker lends CPU servers of these sizes).",
    )
    ram: str | None = Field(None, description="Host RAM to plan with, e.g. 64GiB; unset: what is available.")
    threads: int | None = Field(
        None,
        ge=1,
        description="CPU threads for an engine server that takes a count (a worker's device servers too); "
        "unset: all cores.",
    )
    state_dir: Path = Field(
        default_factory=_default_state_dir,
        description="Where state is kept (remembered configurations, engine logs).",
        json_schema_extra={"shown_default": "~/.local/state/gateway"},
    )
    log_dir: Path | None = Field(None, description="Backend logs; unset: <state_dir>/logs.")
    startup_timeout_s: float = Field(
        900.0,
        gt=0,
        description="How long a backend may take to load before it counts as failed.",
        json_schema_extra={"flags": ["--startup-timeout"]},
    )
    request_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Longest wait for a non-streamed answer (it comes whole, once generated); 504 beyond.",
        json_schema_extra={"flags": ["--request-timeout"]},
    )
    first_byte_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Longest wait for a stream's first byte (the prefill of a long prompt); 504 or an error "
        "event beyond.",
        json_schema_extra={"flags": ["--first-byte-timeout"]},
    )
    stream_idle_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Longest silence between two chunks of a stream before it is ended with an error event; "
        "also how long a client may leave a stream unread before it is cut and its slot freed.",
        json_schema_extra={"flags": ["--stream-idle-timeout"]},
    )
    connect_timeout_s: float = Field(
        10.0, gt=0, description="Connecting to the backend.", json_schema_extra={"flags": ["--connect-timeout"]}
    )
    stall_timeout_s: float = Field(
        300.0,
        gt=0,
        description="While requests are in flight, longest time the engine may make no progress (no chunk relayed, "
        "no change in the progress figures it reports) before it counts as hung: those requests end with an error "
        "and the engine is restarted. Also how long an idle engine's canary may wait. Where the engine's progress "
        "cannot be read, a request in flight is given at least the plan's longest prefill (its context at its "
        "estimated speed), and the log says so.",
        json_schema_extra={"flags": ["--stall-timeout"]},
    )
    canary_interval_s: float = Field(
        300.0,
        ge=0,
        description="How often an idle engine is sent a one-token completion to prove it still answers; 0: never.",
        json_schema_extra={"flags": ["--canary-interval"]},
    )
    restart_limit: int = Field(
        5,
        ge=0,
        description="Restarts a serving engine gets (after 1, 2, 5, 10, 30 s) within restart_window_s when it dies "
        "or hangs; past that the gateway gives up restarting it for now (state failed, /ready says when it tries "
        "again) and tries at restart_retry_s, doubled after each try that fails, up to restart_window_s.",
        json_schema_extra={"flags": ["--restart-limit"]},
    )
    restart_window_s: float = Field(
        600.0,
        gt=0,
        description="The span restart_limit counts restarts in (older ones are forgotten); also the longest wait "
        "between two tries after giving up.",
        json_schema_extra={"flags": ["--restart-window"]},
    )
    restart_retry_s: float = Field(
        30.0,
        gt=0,
        description="After giving up restarting, the wait before the first try to start the engine again.",
        json_schema_extra={"flags": ["--restart-retry"]},
    )
    shutdown_grace_s: float = Field(
        15.0,
        ge=0,
        description="On stop, time requests in flight get to finish (queued ones get 503 at once); then open "
        "streams end with an error event, and the engine's process group gets SIGTERM and, 5 s later, SIGKILL.",
        json_schema_extra={"flags": ["--shutdown-grace"]},
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="Largest request body accepted (413 beyond it); agents' requests, images included, stay far below.",
    )
    max_body_elements: int = Field(
        100_000,
        ge=100,
        description="Most JSON objects and arrays in a request body (413 beyond): bounds the memory and the "
        "event-loop time one body can cost (a flood of tiny messages).",
    )
    max_answer_bytes: int = Field(
        32 * 1024 * 1024, gt=0, description="Largest non-streamed backend answer the gateway holds (502 beyond it)."
    )
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="Largest request line and headers accepted, before the key (431 beyond)."
    )
    max_headers: int = Field(100, ge=8, description="Most request headers accepted (431 beyond).")
    client_header_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Time a client gets to send a request's line and headers (408 and closed beyond).",
        json_schema_extra={"flags": ["--client-header-timeout"]},
    )
    client_body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Longest silence between two reads of a request body (408 and closed beyond).",
        json_schema_extra={"flags": ["--client-body-timeout"]},
    )
    keepalive_timeout_s: float = Field(
        30.0,
        gt=0,
        description="How long an idle kept-alive client connection stays open between requests.",
        json_schema_extra={"flags": ["--keepalive-timeout"]},
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Client connections open at once; more are closed at once, with a log line (lowered to fit "
        "the descriptor limit).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names clients may use besides IP addresses and localhost, checked when no api_keys are "
        "set (DNS rebinding); `*` allows any (comma list).",
        json_schema_extra={"parse": "csv"},
    )
    cors_allow_origins: list[str] = Field(
        default_factory=list,
        description="Web origins allowed to call the API from a browser (comma list; `*` any); none: requests "
        "carrying another site's Origin are refused.",
        json_schema_extra={"parse": "csv"},
    )
    min_context: int = Field(
        65536,
        ge=1,
        description="The context floor: plans below it are a last resort, taken (and said) only when nothing "
        "reaches it; given explicitly, nothing below it is planned (default: 65536, or the pinned "
        "context_length, or the model's limit when smaller).",
    )
    target_context: int = Field(
        131072,
        ge=1,
        description="More context up to this beats weight precision and speed in the plan's ranking "
        "(default: 131072, or the model's limit when smaller).",
    )
    max_context: int | None = Field(None, ge=1, description="Longest context worth reserving; unset: the model's.")
    engine: str | None = Field(
        None,
        description="Plan and serve only this engine; unset: the first that fits.",
        json_schema_extra={"flags": ["--engine", "--backend"]},  # the choices: the registry's names
    )
    catalog_dir: Path | None = Field(None, description="Extra model catalog entries (*.toml); they win over built-ins.")
    backend_url: str | None = Field(
        None, description="Front an OpenAI-compatible server you run yourself; nothing is planned or started."
    )
    backend_api_key: str | None = Field(None, description="Bearer key the backend_url server expects.")
    backend_native_apis: list[str] = Field(
        default_factory=list,
        description="What the backend_url server does itself (comma list): responses, messages, include_usage, "
        "max_completion_tokens, openai_shapes, stream_keepalive (its connections stay usable after a stream; "
        "unset, each stream gets its own); the gateway translates or adds the rest.",
        json_schema_extra={"parse": "csv"},
    )
    backend_max_concurrency: int | None = Field(
        None,
        ge=1,
        description="Requests forwarded at once to a backend_url server (more wait in the queue); unset: the "
        "server's own slots where it says them (/props), else no queueing at all.",
    )
    queue_limit: int = Field(64, ge=0, description="Requests allowed to wait for a free engine slot (429 beyond).")
    sessions: int = Field(
        4,
        ge=1,
        le=1024,
        description="Agent sessions you run at once (subagents count): the plan runs that many requests at once "
        "where it can and keeps their prompts warm between turns, and says how many fit.",
    )
    replicas: str = Field(
        "auto",
        description="Engines to run, each a whole copy of the model on its own GPUs (one node's, or part of them), "
        "each session kept on one: a number, or auto (the plan weighs one engine over all the devices against "
        "replicas: context first, then sessions kept warm and aggregate decode).",
    )
    max_inflight_per_key: int = Field(
        0,
        ge=0,
        description="Requests one API key may have in the engine at once (more wait their turn); 0: no cap, "
        "the keys still share the engine fairly.",
    )
    pause_long_prefills: bool = Field(
        False,
        description="Where the engine resumes a cancelled prefill (its slots keep what it did), prefill a long "
        "prompt ahead of its request and pause it while warm turns run: a warm turn's whole answer beside a burst "
        "of cold prompts takes ~2x its time alone instead of 4-7x, but many sessions' cold first turns at once take "
        "longer (8-21 % on the CPU; docs/many-agents.md).",
    )
    queue_wait_s: float = Field(
        600.0, gt=0, description="Longest wait for a slot before 429.", json_schema_extra={"flags": ["--queue-wait"]}
    )
    balance_abs_threshold: int = Field(
        64,
        ge=0,
        description="With more than one replica: a conversation leaves the replica that holds its cache only when "
        "that replica's load (requests queued or running) exceeds the least loaded one's by more than this, and "
        "by more than balance_rel_threshold times (the cache-aware routers' defaults).",
    )
    balance_rel_threshold: float = Field(
        1.5, ge=1.0, description="With more than one replica: the relative half of balance_abs_threshold's test."
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="Keys clients must send (Bearer or x-api-key; the flag repeats); none: the gateway is open.",
        json_schema_extra={"flags": ["--api-key"], "parse": "append"},
    )
    api_key_file: Path | None = Field(None, description="A file with one accepted key per line (added to api_keys).")
    log_format: str = Field(
        "text",
        pattern="^(text|json)$",
        description="text, or json: one object per line.",
        json_schema_extra={"choices": ["text", "json"]},
    )
    replan: bool = Field(False, description="Ignore the remembered configuration and plan afresh.")
    workers: list[str] = Field(
        default_factory=list,
        description="Other nodes' `gateway worker` addresses (host:port, comma list): the plan pools their "
        "devices with this machine's; one that does not answer is planned without.",
        json_schema_extra={"parse": "csv"},
    )
    worker_api_key: str | None = Field(
        None, description="Key sent to the workers (one of their api_keys); unset: the first of api_keys."
    )

    @field_validator("replicas", mode="before")
    @classmethod
    def _replicas_form(cls, value: Any) -> str:
        """A count from 1 to :data:`MAX_REPLICAS`, or auto."""
        text = str(value).strip().lower()
        if text == "auto" or (text.isdigit() and 1 <= int(text) <= MAX_REPLICAS):
            return text
        raise ValueError(f"replicas {value!r}: give a number from 1 to {MAX_REPLICAS}, or auto")

    @field_validator("context_length", mode="before")
    @classmethod
    def _context_forms(cls, value: Any) -> Any:
        """vLLM's forms: 32k, 32K, and auto / -1 (the longest that fits, kept as -1)."""
        number = parse_count_or_auto(value) if isinstance(value, str) else value
        if isinstance(number, int) and number != AUTO and number < 256:
            raise ValueError(f"context_length {number} is below 256: give 256 or more, or auto")
        return number

    @property
    def backend_log_dir(self) -> Path:
        return self.log_dir or self.state_dir / "logs"

    @property
    def replica_count(self) -> int | None:
        """The engines asked for (``replicas``); None: auto, the plan weighs them."""
        return None if self.replicas == "auto" else int(self.replicas)

    def files_pinned(self) -> bool:
        """A setting that chooses which of the model's files to load (a quantization) was given: a
        configuration remembered here for other files does not apply, and the search runs again."""
        return any(self.model_dump(include=set(self.file_pins)).values())

    def read_api_keys(self) -> tuple[str, ...]:
        """api_keys plus the key file's lines (blank lines and # comments skipped), each without the
        spaces around it (a header value loses them on the way in). Each call reads the file: `serve`
        calls it once (gateway.cli.startup.assemble) and hands the keys on.

        An empty or blank key is refused rather than dropped: ``--api-key "$GATEWAY_API_KEY"`` with the
        variable unset would otherwise start a gateway that believes it has a key and lets everyone in;
        so is a key file that holds none."""
        if any(not key.strip() for key in self.api_keys):
            raise ConfigError(
                "an empty --api-key (or a blank entry in GATEWAY_API_KEYS / api_keys) is no key: is the variable "
                'it came from unset (--api-key "$GATEWAY_API_KEY")? give a non-empty key, or leave the flag out'
            )
        keys = [key.strip() for key in self.api_keys]
        if self.api_key_file is not None:
            try:
                lines = read_regular_file(self.api_key_file, MAX_KEY_FILE_BYTES).decode("utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
                raise ConfigError(f"cannot read api_key_file {self.api_key_file}: {why}") from exc
            found = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
            if not found:
                raise ConfigError(
                    f"api_key_file {self.api_key_file} holds no key (only blank lines or # comments): "
                    "put one key per line, or drop --api-key-file"
                )
            keys += found
        return tuple(keys)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = settings_cls.model_config.get("toml_file") or DEFAULT_CONFIG_FILE
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file))


AUTO = -1  # context_length "auto" / -1: vLLM's own --max-model-len auto
MAX_REPLICAS = 64  # as many GPUs as a plan is asked about (gateway/core/devices.py MAX_GPUS)


def parse_count(text: str) -> int:
    """An integer the way vLLM's flags read it (0.21.0 vllm/utils/argparse_utils.py
    ``human_readable_int``): ``1k`` = 1,000 and ``1K`` = 1,024 (k/m/g/t decimal, K/M/G/T binary,
    no decimals with a binary suffix), else a plain integer; ``4GiB`` / ``4GB`` are read too."""
    value = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
        if "." not in number:
            return int(number) * int(1024 ** ("KMGT".index(suffix) + 1))
        raise ValueError(f"{text!r}: no decimals with a binary suffix like {suffix} (did you mean {text.lower()}?)")
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmMgGtT])(i?)[bB]", value)
    if match:
        number, suffix, binary = match.groups()
        return int(float(number) * (1024 if binary else 1000) ** ("kmgt".index(suffix.lower()) + 1))
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"cannot read {text!r}: write it like 32768, 32k (32,000), 32K (32,768) or 4G") from None


def parse_count_or_auto(text: str) -> int:
    """``parse_count``, plus vLLM's ``-1`` / ``auto`` (``human_readable_int_or_auto``)."""
    return AUTO if text.strip() in ("-1", "auto", "AUTO", "Auto") else parse_count(text)


Kind = TypeVar("Kind", bound=Settings)


def load_settings(kind: type[Kind], overrides: dict[str, Any] | None = None, config_file: Path | None = None) -> Kind:
    """Build the settings of class ``kind`` (the gateway's full settings: gateway.cli.full_settings);
    ``overrides`` are CLI flags (None values mean "not given").

    The config file is ``config_file``, else ``$GATEWAY_CONFIG``, else ``./gateway.toml`` if present.
    An explicitly named file that does not exist is an error rather than silently ignored.
    """
    explicit = config_file or (Path(os.environ["GATEWAY_CONFIG"]) if os.environ.get("GATEWAY_CONFIG") else None)
    if explicit is not None and not explicit.is_file():
        raise ConfigError(f"config file {explicit} does not exist: create it or drop --config/GATEWAY_CONFIG")
    toml_file = explicit or DEFAULT_CONFIG_FILE

    class _FileSettings(kind):  # type: ignore[valid-type,misc]  # a subclass of the class asked for
        model_config = SettingsConfigDict(toml_file=toml_file)

    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    try:
        loaded = _FileSettings(**given)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        source = _source_of(str(first["loc"][0]), given, toml_file) if first["loc"] else None
        source = source or f"{toml_file}, GATEWAY_* or a flag"
        raise ConfigError(f"invalid setting {where}: {first['msg']} (from {source})") from exc
    except ValueError as exc:
        if (unread := _ENV_UNREAD.search(str(exc))) is not None:  # pydantic-settings' SettingsError
            variable = _env_name(unread.group(1))
            raise ConfigError(  # its value is not repeated: it may be a key (GATEWAY_API_KEYS)
                f"cannot read {variable}: it is not JSON, and a list in a variable is written as JSON, e.g. "
                f'{variable}=\'["a", "b"]\' (a flag takes a comma list)'
            ) from exc
        raise ConfigError(f"cannot read {toml_file}: {exc}") from exc  # a malformed TOML file
    return loaded


# what pydantic-settings says of a variable it cannot decode (a list or table given as anything but JSON)
_ENV_UNREAD = re.compile(r'error parsing value for field "(\w+)" from source "EnvSettingsSource"')


def _env_name(field: str) -> str:
    """The variable that sets ``field`` as the user spelled it (names are matched ignoring case)."""
    wanted = f"GATEWAY_{field}".upper()
    return next((name for name in os.environ if name.upper() == wanted), wanted)


def _source_of(field: str, given: dict[str, Any], toml_file: Path) -> str:
    """Where a setting's value came from, highest precedence first: a flag, a variable, the file."""
    if field in given:
        return "a flag"
    variable = _env_name(field)
    return variable if variable in os.environ else str(toml_file)
