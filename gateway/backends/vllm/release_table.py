"""The per-release tables ``scripts/vllm_release_table.py`` extracted from vLLM's sdists, and the
gates the planner asks of them: can this release load the architecture, does it run the model as
MLA, which attention backend would it pick for this compute capability and KV dtype, and what
compute capability does the checkpoint's quantization need. Every answer carries the source line
(``vllm/...py:LINE`` of that release) it rests on.

A version between two tables is answered by the older one (nothing newer was read for it); the
0.15.x releases have no sdist on PyPI (wheels only), so 0.15.x is answered by 0.14.0's table and
says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from gateway.backends.vllm.checkpoint_facts import CheckpointFacts

DATA = Path(__file__).resolve().parent / "release_data"


@cache
def _version(text: str) -> Version:
    """Cached: the vLLM ladder asks for the release table of each rung it sizes (15,000 parses in
    four plans)."""
    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return Version("0")


@cache
def versions() -> tuple[str, ...]:
    """The releases a table was extracted for, oldest first."""
    return tuple(sorted((p.stem for p in DATA.glob("*.json")), key=_version))


@cache
def _load(version: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{version}.json").read_text())
    return data


@dataclass(frozen=True)
class Verdict:
    """One gate's answer: ``ok``, why (in words) and the source line of the release it read."""

    ok: bool
    reason: str
    source: str


@dataclass(frozen=True)
class ReleaseTable:
    """The table answering for ``asked``: ``read`` is the release whose source was read."""

    asked: str
    read: str
    data: dict[str, Any]

    @property
    def exact(self) -> bool:
        return _version(self.asked) == _version(self.read)

    @property
    def provenance(self) -> str:
        """How this release's facts were obtained, for plan notes."""
        if self.exact:
            return f"vLLM {self.read}'s source"
        gap = " (0.15.x: wheels only on PyPI, no source read)" if self.asked.startswith("0.15") else ""
        return f"vLLM {self.read}'s source, the newest release read at or before {self.asked}{gap}"

    # models ------------------------------------------------------------------------------

    def registers(self, architecture: str) -> bool:
        return architecture in self.data["architectures"]["names"]

    def mla_types(self) -> list[str]:
        return list(self.data["mla_model_types"]["values"])

    def uses_mla(self, facts: CheckpointFacts) -> bool:
        """``is_deepseek_mla``: model_type in the release's list (exact spelling) and kv_lora_rank set."""
        return facts.is_mla and facts.model_type in self.data["mla_model_types"]["values"]

    def mtp_draft(self, facts: CheckpointFacts) -> tuple[str, str] | None:
        """(draft model type, source) when ``--speculative-config '{"method": "mtp"}'`` can use the
        model's own MTP layers: ``hf_config_override`` renames its type (or architecture) to a
        type in ``MTPModelTypes``."""
        mtp = self.data["mtp"]
        for key in (facts.architecture, facts.model_type):
            found = mtp["renames"].get(key)
            if found and found["draft"] in mtp["model_types"]:
                return found["draft"], found["source"]
        return None

    # defaults ----------------------------------------------------------------------------

    @property
    def default_utilization(self) -> float:
        return float(self.data["gpu_memory_utilization_default"]["value"])

    @property
    def default_utilization_source(self) -> str:
        return str(self.data["gpu_memory_utilization_default"]["source"])

    # attention ---------------------------------------------------------------------------

    def _capability_key(self, capability: tuple[int, int], table: dict[str, Any]) -> str | None:
        """The evaluated capability this GPU is answered by: itself, else the highest minor of its
        major below it (8.7's answers hold for an unlisted 8.8)."""
        exact = f"{capability[0]}.{capability[1]}"
        if exact in table:
            return exact
        same = [k for k in table if int(k.split(".")[0]) == capability[0] and int(k.split(".")[1]) <= capability[1]]
        return max(same, key=lambda k: int(k.split(".")[1])) if same else None

    def attention_backend(self, facts: CheckpointFacts, capability: tuple[int, int], kv_cache_dtype: str) -> Verdict:
        """The backend ``_get_backend_priorities`` order gives for this model, GPU and KV dtype:
        the first that supports the capability, accepts the dtype and the model's head sizes (sparse
        MLA backends serve only sparse-attention models and are skipped). FlashAttention's fp8 KV
        and head sizes follow the FA version it runs there (FA3's fp8 KV on Hopper, 512 only with
        FA4); a model whose config hook picks the backend for mixed head sizes (Gemma 4) gets that."""
        attention = self.data["attention"]
        kind = "mla" if self.uses_mla(facts) else "standard"
        order_by_cap = attention["priorities"][kind]
        key = self._capability_key(capability, order_by_cap)
        where = attention["priorities_source"]
        if key is None:
            return Verdict(True, f"compute capability {capability[0]}.{capability[1]} not in the table", where)
        dtype = "fp8" if kv_cache_dtype.startswith("fp8") else kv_cache_dtype
        order, why = order_by_cap[key], ""
        if kind == "standard" and (hooked := self._mixed_heads_backend(facts, key)):
            order, where = [hooked[0]], hooked[1]
            heads = f"{facts.head_dim}/{facts.global_head_dim}"
            why = f"; set for head sizes {heads} where FA4 does not run, {hooked[1]}"
        refused: list[str] = []
        for name in order:
            backend = attention["backends"].get(name, {})
            if backend.get("sparse") or backend.get("missing"):
                continue
            if backend["capabilities"].get(key) is not True:
                refused.append(f"{name} not on {key} ({backend['capabilities_source']})")
                continue
            dtypes, dtypes_at = self._kv_dtypes(name, key)
            if dtype not in dtypes:
                refused.append(f"{name} takes KV {'/'.join(dtypes)} ({dtypes_at})")
                continue
            if (head := self._head_refused(name, key, facts)) is not None:
                refused.append(head)
                continue
            fa = self._flash(key) if name == "FLASH_ATTN" else None
            fa_version = fa.get("fa_version") if fa else None
            if fa_version and max(facts.head_dim, facts.global_head_dim) > 256:
                fa_version = 4  # get_flash_attn_version: FA3 on SM90 takes no head size above 256, FA4 does
            version = f", FA{fa_version}" if fa_version else ""
            what = "MLA" if kind == "mla" else "attention"
            return Verdict(True, f"{name} ({what} backend{version}{why})", dtypes_at)
        return Verdict(
            False,
            f"no {'MLA ' if kind == 'mla' else ''}attention backend of vLLM {self.read} runs {kv_cache_dtype} KV on "
            f"compute capability {key}: " + "; ".join(refused),
            where,
        )

    def _flash(self, key: str) -> dict[str, Any] | None:
        """FlashAttention's facts on this capability (FA version, fp8 KV, head sizes), if read."""
        flash = self.data["attention"].get("flash_attn")
        found: dict[str, Any] | None = flash["by_capability"].get(key) if flash else None
        return found

    def _kv_dtypes(self, name: str, key: str) -> tuple[list[str], str]:
        """The KV dtypes a backend takes on this capability, and the line that says so."""
        backend = self.data["attention"]["backends"][name]
        dtypes, where = list(backend["kv_cache_dtypes"]), backend["kv_cache_dtypes_source"]
        fa = self._flash(key) if name == "FLASH_ATTN" else None
        if fa and fa.get("fp8_kv") is True:
            dtypes += [d for d in ("fp8", "fp8_e4m3") if d not in dtypes]
            where = self.data["attention"]["flash_attn"]["fp8_kv_source"]
        return dtypes, where

    def _head_refused(self, name: str, key: str, facts: CheckpointFacts) -> str | None:
        """Why FlashAttention on this capability refuses the model's largest head size, or None."""
        fa = self._flash(key) if name == "FLASH_ATTN" else None
        head = max(facts.head_dim, facts.global_head_dim)
        if not fa or fa["head_sizes"].get(str(head)) is not False:
            return None
        source = self.data["attention"]["flash_attn"]["head_sizes_source"]
        return f"{name} takes no head size {head} on {key} without FA4 ({source})"

    def _mixed_heads_backend(self, facts: CheckpointFacts, key: str) -> tuple[str, str] | None:
        """(backend, source) a model's config hook sets for layers of different head sizes (Gemma 4's
        256 sliding, 512 full): TRITON_ATTN where FA4 does not run; None where it does (the usual
        order, FlashAttention at FA4 on every layer), for other models and for uniform heads."""
        hook = self.data["attention"].get("heterogeneous_head_dims")
        names = {facts.architecture, facts.model_type}
        if not hook or not names & set(hook["names"]) or not facts.global_head_dim:
            return None
        if facts.global_head_dim == facts.head_dim:
            return None
        fa = self._flash(key)
        largest = max(facts.head_dim, facts.global_head_dim)
        fa4 = hook["tries_fa4"] and fa and largest <= (hook["max_fa4_head_size"] or 0)
        if fa4 and fa and fa["head_sizes"].get(str(largest)) is True:  # FA4 runs: the usual order, FA4 everywhere
            return None
        return hook["fallback"], hook["source"]

    # quantization ------------------------------------------------------------------------

    def quantization_capability(self, facts: CheckpointFacts) -> tuple[int, str, str] | None:
        """(minimum capability × 10, which vLLM class decides it, source) for the checkpoint's
        quantization, or None when unquantized or unknown to this table."""
        quant = facts.quantization
        if not quant:
            return None
        table = self.data["quantization"]
        method = facts.quant_method
        if quant in ("nvfp4", "fp8", "mxfp8") and (method.startswith("modelopt") or (not method and quant == "nvfp4")):
            wanted = {"nvfp4": "NVFP4", "fp8": "FP8", "mxfp8": "MXFP8"}[quant]
            for cls, info in table["modelopt_algos"].items():
                if wanted in info["quant_algos"] and info["min_capability"] is not None:
                    assumed = "" if method else " (quant method not named: ModelOpt assumed)"
                    return info["min_capability"], f"{cls}.get_min_capability{assumed}", info["source"]
        if method == "compressed-tensors":
            scheme = {"nvfp4": "CompressedTensorsW4A4Fp4", "fp8": "CompressedTensorsW8A8Fp8"}.get(quant)
            scheme = scheme or {"int8": "CompressedTensorsW8A8Int8", "int4": "CompressedTensorsWNA16"}.get(quant, "")
            schemes = table["compressed_tensors"]["schemes"]
            if scheme in schemes and schemes[scheme]["value"] is not None:
                best = (schemes[scheme]["value"], f"{scheme}.get_min_capability", schemes[scheme]["source"])
                for fallback in table["compressed_tensors"]["fallbacks"]:
                    other = schemes.get(fallback["fallback"], {})
                    if fallback["preferred"] == scheme and other.get("value") is not None and other["value"] < best[0]:
                        best = (
                            other["value"],
                            f"{fallback['fallback']}.get_min_capability (fallback from {scheme}, {fallback['source']})",
                            other["source"],
                        )
                return best
        name = method or {"nvfp4": "modelopt_fp4", "int4": "gptq"}.get(quant, quant)
        found = table["methods"].get(name) or table["methods"].get(quant)
        if found and found["value"] is not None:
            return found["value"], f"{found['config']}.get_min_capability", found["source"]
        return None

    def quantization_verdict(self, facts: CheckpointFacts, capability: tuple[int, int]) -> Verdict | None:
        need = self.quantization_capability(facts)
        if need is None:
            return None
        value, who, where = need
        have = capability[0] * 10 + capability[1]
        text = f"{facts.quantization} needs compute capability {value // 10}.{value % 10}+ ({who}, vLLM {self.read})"
        return Verdict(have >= value, text, where)


@cache
def table_for(version: str) -> ReleaseTable:
    """The table of ``version``, else of the newest release read before it (the oldest table
    for anything older than every table). Cached: asked for by each rung the vLLM ladder sizes."""
    known = versions()
    asked = _version(version)
    older = [v for v in known if _version(v) <= asked]
    read = older[-1] if older else known[0]
    return ReleaseTable(version, read, _load(read))


def first_registering(architecture: str) -> str | None:
    """The oldest release read whose registry lists the architecture."""
    for version in versions():
        if table_for(version).registers(architecture):
            return version
    return None


def next_read(version: str) -> str | None:
    """The oldest release read after ``version``."""
    later = [v for v in versions() if _version(v) > _version(version)]
    return later[0] if later else None
