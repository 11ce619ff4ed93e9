"""Extract what the planner needs from a vLLM source distribution into one JSON table per release.

Usage::

    python scripts/vllm_release_table.py /work/cache/vllm-sdists/vllm-0.21.0.tar.gz [...]
    python scripts/vllm_release_table.py --check /work/cache/vllm-sdists/vllm-*.tar.gz

Writes (or with ``--check`` compares against) ``gateway/backends/vllm/release_data/<version>.json``. Adding a
release is running this on its sdist and reviewing the diff. Every fact carries the file and line
it was read from (``vllm/...py:LINE``) so tests and plans can cite it.

Everything is read with ``ast`` from the release's own Python files: nothing of vLLM is imported
or executed. The few functions whose result the planner needs (``supports_compute_capability``,
``get_min_capability``, ``_get_backend_priorities``) are evaluated by a small interpreter that knows
only comparisons of the device capability; a condition it cannot decide (an environment variable,
a library probe) explores both branches and the fact says so.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "gateway" / "backends" / "vllm" / "release_data"
# compute capabilities every table is evaluated for: Turing to Blackwell consumer parts
CAPABILITIES = ((7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1))
UNKNOWN = object()  # a value the interpreter cannot decide


@dataclass
class Source:
    """The release's Python files, by path relative to the sdist root (``vllm/...``)."""

    files: dict[str, str]

    def tree(self, path: str) -> ast.Module:
        return ast.parse(self.files[path])

    def under(self, prefix: str) -> list[str]:
        return sorted(p for p in self.files if p.startswith(prefix))


def read_sdist(path: Path) -> tuple[str, Source, str]:
    """(version, source files, sha256) of an sdist: only ``vllm/**/*.py`` is read."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    files: dict[str, str] = {}
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) == 2 and parts[1].startswith("vllm/") and parts[1].endswith(".py") and member.isfile():
                handle = archive.extractfile(member)
                if handle:
                    files[parts[1]] = handle.read().decode("utf-8", "replace")
    version = path.name.removeprefix("vllm-").removesuffix(".tar.gz")
    return version, Source(files), digest


def cite(path: str, node: ast.AST) -> str:
    return f"{path}:{getattr(node, 'lineno', 0)}"


def strings(node: ast.AST) -> list[str]:
    """String constants of a literal tuple/list/set/Literal[...] in source order."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def find_function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


# ---------------------------------------------------------------------------------------------
# Models: the registry's architectures, the MLA model types, the MTP draft model types
# ---------------------------------------------------------------------------------------------


def architectures(src: Source) -> dict[str, Any]:
    path = "vllm/model_executor/models/registry.py"
    names: dict[str, str] = {}
    for node in src.tree(path).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if (
            isinstance(target, ast.Name)
            and target.id.endswith("_MODELS")
            and target.id != "_PREVIOUSLY_SUPPORTED_MODELS"
            and isinstance(value, ast.Dict)
        ):
            for key in value.keys:
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    names.setdefault(key.value, cite(path, key))
    return {"names": dict(sorted(names.items())), "source": path}


def mla_model_types(src: Source) -> dict[str, Any]:
    """``is_deepseek_mla``: the tuple of model types compared with ``hf_text_config.model_type``."""
    for path in ("vllm/transformers_utils/model_arch_config_convertor.py", "vllm/config/model.py"):
        if path not in src.files:
            continue
        function = find_function(src.tree(path), "is_deepseek_mla")
        if function is None:
            continue
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Compare)
                and isinstance(node.ops[0], ast.In)
                and "model_type" in ast.unparse(node.left)
                and isinstance(node.comparators[0], ast.Tuple | ast.List)
            ):
                return {"values": strings(node.comparators[0]), "source": cite(path, node.comparators[0])}
    raise SystemExit("is_deepseek_mla's model-type list not found")


def mtp(src: Source) -> dict[str, Any]:
    """``MTPModelTypes`` and ``hf_config_override``'s model type → draft model type renames."""
    path = "vllm/config/speculative.py"
    tree = src.tree(path)
    types: list[str] = []
    where = ""
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MTPModelTypes":
            types, where = strings(node.value), cite(path, node)
    renames: dict[str, dict[str, str]] = {}
    function = find_function(tree, "hf_config_override")
    for node in ast.walk(function) if function else []:
        test = ast.unparse(node.test) if isinstance(node, ast.If) else ""
        if not isinstance(node, ast.If) or ("model_type" not in test and "architectures" not in test):
            continue
        for statement in node.body:
            if (
                isinstance(statement, ast.Assign)
                and ast.unparse(statement.targets[0]).endswith(".model_type")
                and isinstance(statement.value, ast.Constant)
            ):
                for name in strings(node.test):
                    renames.setdefault(name, {"draft": statement.value.value, "source": cite(path, node)})
    return {"model_types": types, "source": where, "renames": renames}


# ---------------------------------------------------------------------------------------------
# A tiny evaluator for capability checks
# ---------------------------------------------------------------------------------------------


class Capability(tuple[int, int]):
    """``DeviceCapability``: compares as (major, minor); ``to_int`` is major × 10 + minor."""

    @property
    def major(self) -> int:
        return self[0]

    @property
    def minor(self) -> int:
        return self[1]

    def to_int(self) -> int:
        return self[0] * 10 + self[1]


def evaluate(node: ast.AST, env: dict[str, Any]) -> Any:
    """The value of an expression built from the names in ``env``, constants and comparisons;
    UNKNOWN where it calls or reads anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id, UNKNOWN)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items = [evaluate(e, env) for e in node.elts]
        return UNKNOWN if any(i is UNKNOWN for i in items) else items
    if isinstance(node, ast.Attribute):
        base = evaluate(node.value, env)
        if isinstance(base, Capability) and node.attr in ("major", "minor"):
            return getattr(base, node.attr)
        if isinstance(base, dict):  # a namespace the caller described (``envs``: environment defaults)
            return base.get(node.attr, UNKNOWN)
        return UNKNOWN
    if isinstance(node, ast.JoinedStr):  # an f-string: a message, never a decision
        return "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
    if isinstance(node, ast.IfExp):
        test = evaluate(node.test, env)
        return UNKNOWN if test is UNKNOWN else evaluate(node.body if test else node.orelse, env)
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        if isinstance(node.func, ast.Name) and callable(env.get(node.func.id)):
            return env[node.func.id](node, env)  # a function of the release, bound by the caller
        platform = _platform_probe(node, env)
        if platform is not UNKNOWN:
            return platform
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("startswith", "endswith") and node.args:
            text, affix = evaluate(node.func.value, env), evaluate(node.args[0], env)
            if isinstance(text, str) and isinstance(affix, str):
                return getattr(text, node.func.attr)(affix)
        if name.endswith("DeviceCapability") and len(node.args) == 2:
            major, minor = (evaluate(a, env) for a in node.args)
            return Capability((major, minor)) if isinstance(major, int) and isinstance(minor, int) else UNKNOWN
        if isinstance(node.func, ast.Attribute) and node.func.attr == "to_int" and not node.args:
            base = evaluate(node.func.value, env)
            return base.to_int() if isinstance(base, Capability) else UNKNOWN
        if isinstance(node.func, ast.Attribute) and node.func.attr == "is_device_capability_family":
            arg = evaluate(node.args[0], env) if node.args else UNKNOWN
            cap = env.get("capability")
            if isinstance(arg, int) and isinstance(cap, Capability):
                return cap.to_int() // 10 == arg // 10
        return UNKNOWN
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = evaluate(node.left, env), evaluate(node.right, env)
        if isinstance(left, int) and isinstance(right, int) and not isinstance(left, bool):
            return _ARITHMETIC[type(node.op)](left, right)
        return UNKNOWN
    if isinstance(node, ast.Subscript):
        base, index = evaluate(node.value, env), evaluate(node.slice, env)
        if isinstance(base, list) and isinstance(index, int) and -len(base) <= index < len(base):
            return base[index]
        return UNKNOWN
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value = evaluate(node.operand, env)
        return UNKNOWN if value is UNKNOWN else not value
    if isinstance(node, ast.BoolOp):
        values = []
        for operand in node.values:  # in order, stopping where Python would
            values.append(evaluate(operand, env))
            if values[-1] is not UNKNOWN and bool(values[-1]) != isinstance(node.op, ast.And):
                break
        if isinstance(node.op, ast.And):
            if any(v is not UNKNOWN and not v for v in values):
                return False
            return UNKNOWN if any(v is UNKNOWN for v in values) else True
        if any(v is not UNKNOWN and v for v in values):
            return True
        return UNKNOWN if any(v is UNKNOWN for v in values) else False
    if isinstance(node, ast.Compare):
        left = evaluate(node.left, env)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = evaluate(right_node, env)
            if left is UNKNOWN or right is UNKNOWN:
                return UNKNOWN
            ok = _compare(op, left, right)
            if ok is UNKNOWN or not ok:
                return ok
            left = right
        return True
    return UNKNOWN


_ARITHMETIC = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b if b else UNKNOWN,
    ast.Mod: lambda a, b: a % b if b else UNKNOWN,
}


def _platform_probe(node: ast.Call, env: dict[str, Any]) -> Any:
    """``current_platform.X(...)`` on a CUDA device of ``env["capability"]``; UNKNOWN otherwise."""
    cap = env.get("capability")
    func = node.func
    if not env.get("platform_probes"):  # only the FlashAttention facts ask (the older facts never did)
        return UNKNOWN
    if not (isinstance(func, ast.Attribute) and ast.unparse(func.value) == "current_platform"):
        return UNKNOWN
    if not isinstance(cap, Capability):
        return UNKNOWN
    arg = evaluate(node.args[0], env) if node.args else UNKNOWN
    probes = {
        "is_cuda": lambda: True,
        "is_rocm": lambda: False,
        "is_xpu": lambda: False,
        "is_cpu": lambda: False,
        "get_device_capability": lambda: cap,
        "is_device_capability": lambda: cap.to_int() == arg if isinstance(arg, int) else UNKNOWN,
        "has_device_capability": lambda: cap.to_int() >= arg if isinstance(arg, int) else UNKNOWN,
    }
    probe = probes.get(func.attr)
    return probe() if probe else UNKNOWN


def _compare(op: ast.cmpop, left: Any, right: Any) -> Any:
    table = {
        ast.Is: lambda a, b: a is b,
        ast.IsNot: lambda a, b: a is not b,
        ast.Eq: lambda a, b: a == b,
        ast.NotEq: lambda a, b: a != b,
        ast.Lt: lambda a, b: a < b,
        ast.LtE: lambda a, b: a <= b,
        ast.Gt: lambda a, b: a > b,
        ast.GtE: lambda a, b: a >= b,
        ast.In: lambda a, b: a in b,
        ast.NotIn: lambda a, b: a not in b,
    }
    function = table.get(type(op))
    try:
        return UNKNOWN if function is None else function(left, right)
    except TypeError:  # None > 256: the guard before it in an ``and`` decides
        return UNKNOWN


def run_body(body: list[ast.stmt], env: dict[str, Any]) -> list[Any]:
    """The values the statements can return: one when every condition on the way is decided,
    several where an undecided condition is explored both ways. Assignments extend ``env``."""
    for index, statement in enumerate(body):
        if isinstance(statement, ast.Return):
            return [evaluate(statement.value, env) if statement.value else None]
        if isinstance(statement, ast.If):
            test = evaluate(statement.test, env)
            rest = body[index + 1 :]
            if test is UNKNOWN:
                return run_body(statement.body + rest, dict(env)) + run_body(statement.orelse + rest, dict(env))
            return run_body((statement.body if test else statement.orelse) + rest, env)
        if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
            env[statement.targets[0].id] = evaluate(statement.value, env)
        if isinstance(statement, ast.Try) and env.get("enter_try"):  # the import inside succeeds
            return run_body(statement.body + body[index + 1 :], env)
    return []


# ---------------------------------------------------------------------------------------------
# Classes across files: attribute and method lookup through same-named bases
# ---------------------------------------------------------------------------------------------


@dataclass
class ClassInfo:
    name: str
    path: str
    node: ast.ClassDef

    @property
    def bases(self) -> list[str]:
        return [ast.unparse(b).split(".")[-1].split("[")[0] for b in self.node.bases]


def class_index(src: Source, prefixes: tuple[str, ...]) -> dict[str, ClassInfo]:
    index: dict[str, ClassInfo] = {}
    for prefix in prefixes:
        for path in src.under(prefix):
            try:
                tree = src.tree(path)
            except SyntaxError:
                continue
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    index.setdefault(node.name, ClassInfo(node.name, path, node))
    return index


def lookup(index: dict[str, ClassInfo], name: str, member: str) -> tuple[ClassInfo, ast.stmt] | None:
    """The first definition of ``member`` along ``name``'s bases (depth first, as the MRO mostly is)."""
    seen: set[str] = set()
    stack = [name]
    while stack:
        current = stack.pop(0)
        if current in seen or current not in index:
            continue
        seen.add(current)
        info = index[current]
        for statement in info.node.body:
            if isinstance(statement, ast.FunctionDef) and statement.name == member:
                return info, statement
            target = (
                statement.target
                if isinstance(statement, ast.AnnAssign)
                else statement.targets[0]
                if isinstance(statement, ast.Assign)
                else None
            )
            if isinstance(target, ast.Name) and target.id == member:
                return info, statement
        stack = info.bases + stack
    return None


# ---------------------------------------------------------------------------------------------
# Attention backends
# ---------------------------------------------------------------------------------------------

BACKEND_PREFIXES = ("vllm/v1/attention/", "vllm/attention/")


def backend_enum(src: Source) -> dict[str, tuple[str, str]]:
    """AttentionBackendEnum member → (class name, source) from its default class path."""
    for path in ("vllm/v1/attention/backends/registry.py", "vllm/attention/backends/registry.py"):
        if path not in src.files:
            continue
        for node in ast.walk(src.tree(path)):
            if isinstance(node, ast.ClassDef) and node.name == "AttentionBackendEnum":
                members: dict[str, tuple[str, str]] = {}
                for statement in node.body:
                    if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
                        text = "".join(strings(statement.value))
                        if text.startswith("vllm."):
                            members[statement.targets[0].id] = (text.rsplit(".", 1)[1], cite(path, statement))
                return members
    raise SystemExit("AttentionBackendEnum not found")


def _capability_support(index: dict[str, ClassInfo], cls: str) -> tuple[dict[str, Any], str]:
    found = lookup(index, cls, "supports_compute_capability")
    if found is None or not isinstance(found[1], ast.FunctionDef):
        return {f"{a}.{b}": "unknown" for a, b in CAPABILITIES}, ""
    info, function = found
    argument = function.args.args[-1].arg
    support: dict[str, Any] = {}
    for cap in CAPABILITIES:
        results = run_body(function.body, {argument: Capability(cap), "capability": Capability(cap)})
        decided = {r for r in results if r is not UNKNOWN and isinstance(r, bool)}
        support[f"{cap[0]}.{cap[1]}"] = (
            decided.pop() if len(decided) == 1 and len(results) == 1 else "unknown" if not decided else "conditional"
        )
    return support, cite(info.path, function)


def _kv_dtypes(index: dict[str, ClassInfo], cls: str) -> tuple[list[str], str, str]:
    """(accepted KV cache dtypes, source, note): ``supported_kv_cache_dtypes``, unless the class
    overrides ``supports_kv_cache_dtype`` with its own logic (FLASH_ATTN: fp8 only with FA3)."""
    override = lookup(index, cls, "supports_kv_cache_dtype")
    listed = lookup(index, cls, "supported_kv_cache_dtypes")
    values: list[str] = []
    where = ""
    if listed is not None:
        info, statement = listed
        value = statement.value if isinstance(statement, ast.Assign | ast.AnnAssign) else None
        values, where = (strings(value) if value is not None else []), cite(info.path, statement)
    note = ""
    inherits = override is not None and "super().supports_kv_cache_dtype" in ast.unparse(override[1])
    if override is not None and override[0].name != "AttentionBackend" and not inherits:
        info, function = override
        body = ast.unparse(function)
        plain = [s for s in strings(function) if s in ("auto", "bfloat16", "float16")]
        values = sorted(set(plain)) or ["auto"]
        where = cite(info.path, function)
        if "fp8" in body:
            note = (
                "fp8 only where "
                + body.split("startswith('fp8'):", 1)[-1].split("return", 1)[-1].split("\n")[0].strip()
            )
    return values, where, note


def _is_sparse(index: dict[str, ClassInfo], cls: str) -> bool:
    found = lookup(index, cls, "is_sparse")
    if found is None or not isinstance(found[1], ast.FunctionDef):
        return False
    return run_body(found[1].body, {}) == [True]


def _is_mla(index: dict[str, ClassInfo], cls: str, path: str) -> bool:
    found = lookup(index, cls, "is_mla")
    if found is not None and isinstance(found[1], ast.FunctionDef):
        return run_body(found[1].body, {}) == [True]
    return "/mla/" in path


def priorities(src: Source, members: set[str]) -> dict[str, Any]:
    """``_get_backend_priorities`` of ``platforms/cuda.py`` per (MLA or not, capability): the
    backends in order; conditions on other arguments (KV dtype, head count, non-causal) are explored
    both ways and their lists merged, first occurrence kept."""
    path = "vllm/platforms/cuda.py"
    function = find_function(src.tree(path), "_get_backend_priorities")
    if function is None:
        raise SystemExit("_get_backend_priorities not found")
    arguments = [a.arg for a in function.args.args]
    enum_values = {name: name for name in members}
    table: dict[str, dict[str, list[str]]] = {"mla": {}, "standard": {}}
    for use_mla in (True, False):
        for cap in CAPABILITIES:
            env: dict[str, Any] = {"AttentionBackendEnum": UNKNOWN, "use_mla": use_mla}
            env[arguments[1]] = Capability(cap)
            env.update({"use_non_causal": False, "use_mm_prefix": False})
            order: list[str] = []
            for result in _run_lists(function.body, env, enum_values):
                for name in result:
                    if name not in order:
                        order.append(name)
            table["mla" if use_mla else "standard"][f"{cap[0]}.{cap[1]}"] = order
    return {"order": table, "source": cite(path, function)}


def _enum_list(node: ast.AST, env: dict[str, Any], members: dict[str, str]) -> list[str]:
    """Backend names of a list expression, in order: members, starred variables, conditional parts."""
    out: list[str] = []
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "AttentionBackendEnum":
        return [node.attr]
    if isinstance(node, ast.Name):
        value = env.get(node.id)
        return list(value) if isinstance(value, list) else []
    if isinstance(node, ast.Starred):
        return _enum_list(node.value, env, members)
    if isinstance(node, ast.IfExp):
        test = evaluate(node.test, env)
        parts = [node.body, node.orelse] if test is UNKNOWN else [node.body if test else node.orelse]
        for part in parts:
            out += _enum_list(part, env, members)
        return out
    if isinstance(node, ast.List | ast.Tuple):
        for element in node.elts:
            out += _enum_list(element, env, members)
    return out


def _run_lists(body: list[ast.stmt], env: dict[str, Any], members: dict[str, str]) -> list[list[str]]:
    for index, statement in enumerate(body):
        if isinstance(statement, ast.Return) and statement.value is not None:
            return [_enum_list(statement.value, env, members)]
        if isinstance(statement, ast.If):
            test = evaluate(statement.test, env)
            rest = body[index + 1 :]
            if test is UNKNOWN:
                return _run_lists(statement.body + rest, dict(env), members) + _run_lists(
                    statement.orelse + rest, dict(env), members
                )
            return _run_lists((statement.body if test else statement.orelse) + rest, env, members)
        if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
            env[statement.targets[0].id] = _enum_list(statement.value, env, members)
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            call = statement.value
            if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
                target = env.get(call.func.value.id)
                if isinstance(target, list) and call.func.attr in ("append", "insert") and call.args:
                    target += _enum_list(call.args[-1], env, members)
    return []


def attention(src: Source) -> dict[str, Any]:
    index = class_index(src, BACKEND_PREFIXES)
    enum = backend_enum(src)
    order = priorities(src, set(enum))
    used = {name for lists in order["order"].values() for names in lists.values() for name in names}
    backends: dict[str, Any] = {}
    for name in sorted(used):
        cls, where = enum.get(name, ("", ""))
        info = index.get(cls)
        if info is None:
            backends[name] = {"class": cls, "source": where, "missing": True}
            continue
        support, support_at = _capability_support(index, cls)
        dtypes, dtypes_at, note = _kv_dtypes(index, cls)
        backends[name] = {
            "class": cls,
            "source": cite(info.path, info.node),
            "mla": _is_mla(index, cls, info.path),
            "sparse": _is_sparse(index, cls),
            "capabilities": support,
            "capabilities_source": support_at,
            "kv_cache_dtypes": dtypes,
            "kv_cache_dtypes_source": dtypes_at,
            **({"kv_cache_dtypes_note": note} if note else {}),
        }
    out = {"backends": backends, "priorities": order["order"], "priorities_source": order["source"]}
    if flash := flash_attention(src):
        out["flash_attn"] = flash
    if mixed := heterogeneous_heads(src):
        out["heterogeneous_head_dims"] = mixed
    return out


# ---------------------------------------------------------------------------------------------
# FlashAttention: which FA version a capability gets, its fp8 KV and head sizes
# ---------------------------------------------------------------------------------------------

FA_UTILS = ("vllm/v1/attention/backends/fa_utils.py", "vllm/attention/utils/fa_utils.py")
FA_INTERFACE = "vllm/vllm_flash_attn/flash_attn_interface.py"
HEAD_SIZES = (128, 256, 512)
# what the interpreter assumes of the machine: the CUDA wheel built every FA version
# (``FAn_AVAILABLE``), no configuration or environment variable overrides the FA version
FA_ASSUMED = (
    "the CUDA wheel's FA2/FA3/FA4 builds present; no --attention-config flash_attn_version; "
    "without flash_attn_interface.py in the sdist: FA2 from 8.0, FA3 on 9.x"
)


_UNQUANTIZED = ("auto", "float16", "bfloat16", None)


def _fa_assumed(node: ast.Call, env: dict[str, Any], cap: tuple[int, int]) -> Any:
    """``is_fa_version_supported`` where the sdist has no flash_attn_interface.py (before 0.17):
    what every later interface says, FA2 from 8.0, FA3 on 9.x, FA4 on 9.x–11.x."""
    version = evaluate(node.args[0], env) if node.args else UNKNOWN
    return {2: cap >= (8, 0), 3: cap[0] == 9, 4: cap[0] in (9, 10, 11)}.get(version, UNKNOWN)


def _bind(function: ast.FunctionDef, module: dict[str, Any]) -> Any:
    """A release function as a callable of the interpreter: its parameters bound from the call's
    arguments (else their defaults), its body run; its value where every path that returns agrees."""

    def call(node: ast.Call, env: dict[str, Any]) -> Any:
        local = dict(module)
        params = function.args
        positional = [a.arg for a in params.posonlyargs + params.args]
        if positional and positional[0] == "cls":
            positional = positional[1:]
        for name, default in zip(positional[len(positional) - len(params.defaults) :], params.defaults, strict=True):
            local[name] = evaluate(default, local)
        for arg, default in zip(params.kwonlyargs, params.kw_defaults, strict=True):
            if default is not None:
                local[arg.arg] = evaluate(default, local)
        for name, value in zip(positional, node.args, strict=False):
            local[name] = evaluate(value, env)
        for keyword in node.keywords:
            if keyword.arg:
                local[keyword.arg] = evaluate(keyword.value, env)
        results = run_body(function.body, local)
        if not results or any(r is UNKNOWN for r in results) or any(r != results[0] for r in results):
            return UNKNOWN
        return results[0]

    return call


def _call(name: str, *args: Any) -> ast.Call:
    return ast.Call(ast.Name(name), [ast.Constant(a) for a in args], [])


def flash_attention(src: Source) -> dict[str, Any] | None:
    """Per capability: the FA version ``get_flash_attn_version`` picks by default, whether
    FlashAttention takes fp8 KV there (``flash_attn_supports_kv_cache_dtype``, earlier
    ``flash_attn_supports_fp8``: FA3 on Hopper) and which head sizes its ``supports_head_size``
    accepts (512 only with FA4). Each function is run by the interpreter for that capability."""
    utils = next((p for p in FA_UTILS if p in src.files), None)
    if utils is None:
        return None
    index = class_index(src, BACKEND_PREFIXES)
    head = lookup(index, "FlashAttentionBackend", "supports_head_size")
    kv = lookup(index, "FlashAttentionBackend", "supports_kv_cache_dtype")
    listed = lookup(index, "FlashAttentionBackend", "supported_kv_cache_dtypes")
    listed_value = listed[1].value if listed and isinstance(listed[1], ast.Assign | ast.AnnAssign) else None
    functions: dict[str, tuple[str, ast.FunctionDef]] = {}
    for path in (FA_INTERFACE, utils):
        for node in src.tree(path).body if path in src.files else []:
            if isinstance(node, ast.FunctionDef):
                functions.setdefault(node.name, (path, node))
    if "get_flash_attn_version" not in functions or kv is None or not isinstance(kv[1], ast.FunctionDef):
        return None
    by_capability: dict[str, Any] = {}
    for cap in CAPABILITIES:
        module: dict[str, Any] = {
            "capability": Capability(cap),
            "platform_probes": True,
            "enter_try": True,
            "envs": {"VLLM_BATCH_INVARIANT": False},
            "get_current_vllm_config_or_none": lambda node, env: None,
            **{f"FA{n}_AVAILABLE": True for n in (2, 3, 4)},
        }
        if FA_INTERFACE not in src.files:  # older sdists ship no interface: FA3 on Hopper, FA2 from 8.0
            module["is_fa_version_supported"] = lambda node, env, cap=cap: _fa_assumed(node, env, cap)
        # vLLM's own test of the dtype's name, simplified: anything but the unquantized spellings
        module["is_quantized_kv_cache"] = lambda node, env: evaluate(node.args[0], env) not in _UNQUANTIZED
        for name, (_, function) in functions.items():
            module.setdefault(name, _bind(function, module))
        module["_is_fa_version_supported"] = module.get("is_fa_version_supported")
        module["cls"] = {"supported_kv_cache_dtypes": strings(listed_value) if listed_value is not None else []}
        version = evaluate(_call("get_flash_attn_version"), module)
        fp8 = _bind(kv[1], module)(_call("supports_kv_cache_dtype", "fp8"), module)
        sizes: dict[str, Any] = {}
        if head is not None and isinstance(head[1], ast.FunctionDef):
            accepts = _bind(head[1], module)
            for size in HEAD_SIZES:
                value = accepts(_call("supports_head_size", size), module)
                sizes[str(size)] = value if isinstance(value, bool) else "unknown"
        by_capability[f"{cap[0]}.{cap[1]}"] = {
            "fa_version": version if isinstance(version, int) else None,
            "fp8_kv": fp8 if isinstance(fp8, bool) else "unknown",
            "head_sizes": sizes,
        }
    version_path, version_function = functions["get_flash_attn_version"]
    return {
        "by_capability": by_capability,
        "fa_version_source": cite(version_path, version_function),
        "fp8_kv_source": cite(kv[0].path, kv[1]),
        "head_sizes_source": cite(head[0].path, head[1]) if head else "",
        "assumes": FA_ASSUMED,
    }


def heterogeneous_heads(src: Source) -> dict[str, Any] | None:
    """Models whose config hook picks the attention backend for layers of different head sizes
    (Gemma 4: 256 sliding, 512 full): the model types ``MODELS_CONFIG_MAP`` sends to a
    ``verify_and_update_config`` that forces TRITON_ATTN, and whether it first tries FA4 on every
    layer where ``is_fa_version_supported(4)``."""
    path = "vllm/model_executor/models/config.py"
    if path not in src.files:
        return None
    tree = src.tree(path)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    hooks = {
        name: node
        for name, node in classes.items()
        if "TRITON_ATTN" in ast.unparse(node) and "head_dim" in ast.unparse(node) and "Gemma" in name
    }
    if not hooks:
        return None
    model_types: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(isinstance(v, ast.Name) and v.id in hooks for v in node.values):
            model_types += [
                k.value
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Name) and v.id in hooks
            ]
    hook = next(iter(hooks.values()))
    text = ast.unparse(hook)
    return {
        "names": sorted(set(model_types)),  # MODELS_CONFIG_MAP keys: architectures (0.32) or model types
        "tries_fa4": "is_fa_version_supported(4)" in text,
        "max_fa4_head_size": 512 if "<= 512" in text else None,
        "fallback": "TRITON_ATTN",
        "source": cite(path, hook),
    }


# ---------------------------------------------------------------------------------------------
# Quantization
# ---------------------------------------------------------------------------------------------

QUANT_DIR = "vllm/model_executor/layers/quantization/"


def _min_capability(index: dict[str, ClassInfo], cls: str) -> dict[str, Any]:
    """``get_min_capability``: the unconditional result (an env-gated alternative is noted)."""
    found = lookup(index, cls, "get_min_capability")
    if found is None or not isinstance(found[1], ast.FunctionDef):
        return {"value": None, "source": ""}
    info, function = found
    results = [r for r in run_body(function.body, {}) if isinstance(r, int)]
    fact: dict[str, Any] = {"value": results[-1] if results else None, "source": cite(info.path, function)}
    if len(set(results)) > 1:
        fact["alternatives"] = sorted(set(results))
    return fact


def quantization(src: Source) -> dict[str, Any]:
    path = QUANT_DIR + "__init__.py"
    tree = src.tree(path)
    index = class_index(src, (QUANT_DIR,))
    function = find_function(tree, "get_quantization_config")
    configs: dict[str, str] = {}
    for node in ast.walk(function) if function else []:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "method_to_config" and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant):
                    configs[str(key.value)] = ast.unparse(value)
    methods: dict[str, Any] = {}
    for method, cls in sorted(configs.items()):
        methods[method] = {"config": cls, **_min_capability(index, cls)}
    schemes = {
        name: _min_capability(index, name)
        for name, info in sorted(index.items())
        if info.path.startswith(QUANT_DIR + "compressed_tensors/schemes/") and name.startswith("CompressedTensors")
    }
    return {
        "methods": methods,
        "source": cite(path, function) if function else path,
        "modelopt_algos": _modelopt_algos(src, index),
        "compressed_tensors": {"schemes": schemes, "fallbacks": _ct_fallbacks(src)},
    }


def _modelopt_algos(src: Source, index: dict[str, ClassInfo]) -> dict[str, Any]:
    """Which ModelOpt config claims which ``quant_algo``: the string constants its
    ``override_quantization_method`` (or the helper it calls) compares the algorithm with."""
    out: dict[str, Any] = {}
    for cls in ("ModelOptFp8Config", "ModelOptNvFp4Config", "ModelOptMxFp8Config", "ModelOptMixedPrecisionConfig"):
        found = lookup(index, cls, "override_quantization_method")
        if found is None or not isinstance(found[1], ast.FunctionDef):
            continue
        info, function = found
        text = ast.unparse(function)
        algos = sorted({s for s in strings(function) if s.isupper() and ("FP" in s or "MIXED" in s)})
        if not algos:  # the algos live in a module-level set the function names
            names = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and n.id.isupper()}
            for node in src.tree(info.path).body:
                if isinstance(node, ast.Assign | ast.AnnAssign):
                    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                    if isinstance(target, ast.Name) and target.id in names and node.value is not None:
                        algos += [s for s in strings(node.value) if s.isupper()]
        out[cls] = {
            "quant_algos": sorted(set(algos)),
            "min_capability": _min_capability(index, cls)["value"],
            "source": cite(info.path, function),
            "reads_quant_algo": "quant_algo" in text or "algo" in text,
        }
    return out


def _ct_fallbacks(src: Source) -> list[dict[str, str]]:
    """compressed-tensors scheme choices made by capability: ``return A(...)`` when a probe of
    capability succeeds, ``return B(...)`` otherwise (W8A8 FP8 → W8A16 FP8 via Marlin; W4A4 NVFP4
    → W4A16 NVFP4 before cutlass FP4 was universal)."""
    path = QUANT_DIR + "compressed_tensors/compressed_tensors.py"
    function = find_function(src.tree(path), "_get_scheme_from_parts")
    out: list[dict[str, str]] = []
    for node in ast.walk(function) if function else []:
        if not isinstance(node, ast.If):
            continue
        test = ast.unparse(node.test)
        if not any(word in test for word in ("supported", "cutlass", "EMULATION")):
            continue
        chosen = _returned_class(node.body)
        fallback = _returned_class(node.orelse)
        if chosen and fallback and chosen != fallback:
            out.append({"preferred": chosen, "fallback": fallback, "when": test, "source": cite(path, node)})
    return out


def _returned_class(body: list[ast.stmt]) -> str:
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
                return ast.unparse(node.value.func)
    return ""


# ---------------------------------------------------------------------------------------------
# Defaults: parsers, utilization, CUDA graph sizes
# ---------------------------------------------------------------------------------------------


def parsers(src: Source, path: str, table: str) -> dict[str, Any]:
    """Names a parser package registers: its lazy table's keys, else ``register_module`` names."""
    names: list[str] = []
    where = path
    for node in ast.walk(src.tree(path)):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == table and isinstance(node.value, ast.Dict):
            names = [k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            where = cite(path, node)
    if not names:
        folder = path.rsplit("/", 1)[0] + "/"
        for file in src.under(folder):
            for node in ast.walk(src.tree(file)):
                if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("register_module"):
                    names += strings(node.args[0]) if node.args else []
                    for keyword in node.keywords:
                        if keyword.arg == "name":
                            names += strings(keyword.value)
    return {"names": sorted(set(names)), "source": where}


def utilization(src: Source) -> dict[str, Any]:
    path = "vllm/config/cache.py"
    for node in ast.walk(src.tree(path)):
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "gpu_memory_utilization":
            value = node.value
            if isinstance(value, ast.Call):
                for keyword in value.keywords:
                    if keyword.arg == "default":
                        value = keyword.value
            if isinstance(value, ast.Constant):
                return {"value": value.value, "source": cite(path, node)}
    raise SystemExit("CacheConfig.gpu_memory_utilization not found")


def cudagraph(src: Source) -> dict[str, Any]:
    """The capture-size ceiling expression of ``_set_cudagraph_sizes`` (config/vllm.py)."""
    path = "vllm/config/vllm.py"
    function = find_function(src.tree(path), "_set_cudagraph_sizes")
    lines: list[dict[str, str]] = []
    for node in ast.walk(function) if function else []:
        if isinstance(node, ast.Assign) and "max" in ast.unparse(node.targets[0]) and "min(" in ast.unparse(node.value):
            lines.append({"expression": ast.unparse(node), "source": cite(path, node)})
    lines.sort(key=lambda line: int(line["source"].rsplit(":", 1)[1]))
    reserved = [
        cite(path_, node)
        for path_ in ("vllm/v1/worker/gpu_worker.py",)
        if path_ in src.files
        for node in ast.walk(src.tree(path_))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "CUDA graph memory profiling" in node.value
    ]
    return {"capture_size_ceiling": lines, "memory_profiled_before_kv": reserved[:1]}


def table(sdist: Path) -> dict[str, Any]:
    version, src, digest = read_sdist(sdist)
    return {
        "version": version,
        "sdist": {"file": sdist.name, "sha256": digest},
        "architectures": architectures(src),
        "mla_model_types": mla_model_types(src),
        "mtp": mtp(src),
        "attention": attention(src),
        "quantization": quantization(src),
        "tool_parsers": parsers(src, "vllm/tool_parsers/__init__.py", "_TOOL_PARSERS_TO_REGISTER")
        if "vllm/tool_parsers/__init__.py" in src.files
        else parsers(src, "vllm/entrypoints/openai/tool_parsers/__init__.py", "_TOOL_PARSERS_TO_REGISTER"),
        "reasoning_parsers": parsers(src, "vllm/reasoning/__init__.py", "_REASONING_PARSERS_TO_REGISTER"),
        "gpu_memory_utilization_default": utilization(src),
        "cudagraph": cudagraph(src),
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sdists", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="compare with the checked-in tables, write nothing")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    differ = 0
    for sdist in args.sdists:
        data = table(sdist)
        target = args.out / f"{data['version']}.json"
        text = render(data)
        if args.check:
            same = target.exists() and target.read_text() == text
            print(f"{target.name}: {'reproduced' if same else 'DIFFERS'}")
            differ += not same
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(
                f"{target}: {len(data['architectures']['names'])} architectures, "
                f"{len(data['attention']['backends'])} attention backends"
            )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
