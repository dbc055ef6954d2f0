"""What kvcoord.vllm relies on in vLLM, checked against the INSTALLED vLLM.

A new vLLM release that changes any of it fails
:func:`test_installed_vllm_is_what_kvcoord_relies_on` once, with one line
per difference, instead of failing a user's engine:

1. every fact of ``kvcoord.vllm.serve._versions.installed()`` against the real
   thing: the manager's constructor parameters, whether the request block
   hasher takes hash lookahead, and whether an EAGLE group drops its last
   hit block without ``use_eagle`` (measured on vLLM's own manager);
2. every vLLM module and attribute ``kvcoord.vllm`` imports or reads
   (:func:`kvcoord_reads` derives them from kvcoord's source: the results of
   ``importlib.import_module("vllm...")`` and what is read off them, plus
   the names only known at run time, :data:`DYNAMIC_READS`), with the calls
   kvcoord makes on them bound to their signatures;
3. every attribute the installed scheduler reads or calls on
   ``self.kv_cache_manager`` (parsed from its source), on kvcoord's manager,
   each call bound to kvcoord's signature;
4. the scheduler's ``KVCacheManager(...)`` call, bound by kvcoord's
   ``bind_args``.

The checkers take their inputs as arguments; the ``test_*_sees_*`` tests feed
them drifted facts and sources and assert each drift is reported.

Skipped when vLLM is not installed (``make test-vllm`` runs it).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm.v1.core.kv_cache_manager",
    reason="needs vLLM 0.32.x or 0.33.0 (pip install kvcoord[vllm])",
)

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

import kvcoord.vllm as kv
from kvcoord.vllm.serve import _construct, _hasher, _patch, _versions, _views
from kvcoord.vllm.testing import _hit_search

PACKAGE = Path(kv.__file__).resolve().parent
BS = 4
#: The installed scheduler modules whose use of ``self.kv_cache_manager`` is checked.
SCHEDULER_MODULES = ("vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.async_scheduler")
MANAGER_ATTR = "kv_cache_manager"


# --------------------------------------------------------------------------
# What is read, and where


@dataclasses.dataclass(frozen=True)
class Call:
    """How a call site calls: positional arguments, keyword names, and
    whether it splats (``*args`` / ``**kwargs``: counts unknown)."""

    positional: int
    keywords: tuple[str, ...] = ()
    star: bool = False

    @classmethod
    def of(cls, node: ast.Call) -> Call:
        star = any(isinstance(a, ast.Starred) for a in node.args)
        star |= any(k.arg is None for k in node.keywords)
        return cls(
            sum(not isinstance(a, ast.Starred) for a in node.args),
            tuple(k.arg for k in node.keywords if k.arg is not None),
            star,
        )

    def fails(self, target: Any) -> str | None:
        """Why this call does not bind to ``target``'s signature, or None."""
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError) as e:
            return f"no signature to check ({e})"
        args = [object()] * self.positional
        kwargs = {k: object() for k in self.keywords}
        try:
            (sig.bind_partial if self.star else sig.bind)(*args, **kwargs)
        except TypeError as e:
            return f"{self} does not bind to {sig}: {e}"
        return None

    def __str__(self) -> str:
        parts = [f"{self.positional} positional"] + [f"{k}=" for k in self.keywords]
        return "(" + ", ".join(parts) + (", *..." if self.star else "") + ")"


@dataclasses.dataclass(frozen=True)
class Read:
    """kvcoord reads ``module.attrs`` (and calls it, when ``call``)."""

    module: str
    attrs: tuple[str, ...] = ()
    optional: bool = False  # guarded by hasattr / a getattr default
    module_optional: bool = False  # imported inside try/except
    call: Call | None = None
    #: reached only when this fact of the installed vLLM holds (a GUARDED key)
    when: str | None = None

    @property
    def name(self) -> str:
        return ":".join([self.module, ".".join(self.attrs)]) if self.attrs else self.module


@dataclasses.dataclass(frozen=True)
class Use:
    """The scheduler reads ``self.kv_cache_manager.<path>`` (and calls it)."""

    path: tuple[str, ...]
    call: Call | None = None
    store: bool = False

    @property
    def name(self) -> str:
        return ".".join((MANAGER_ATTR, *self.path))


# --------------------------------------------------------------------------
# 1. The facts of kvcoord.vllm.serve._versions


@dataclasses.dataclass(frozen=True)
class Observed:
    """The installed vLLM, as kvcoord's facts describe it."""

    version: str
    manager_init: Callable[..., Any]  # KVCacheManager.__init__
    block_hasher: Callable[..., Any]  # get_request_block_hasher (vLLM's own)
    #: hit tokens of vLLM's own manager, by (is_eagle_group, use_eagle)
    eagle_hits: dict[tuple[bool, bool], int]
    #: source of ``MambaManager._cache_partial_tail_block`` (the prompt-tail key)
    mamba_tail_source: str = ""
    #: source of ``SingleTypeKVCacheManager.cache_blocks`` (retained boundaries)
    cache_blocks_source: str = ""
    #: source of ``SingleTypeKVCacheManager.pop_blocks_for_free``
    pop_source: str = ""
    #: KVCacheManager.get_computed_blocks (vLLM's own)
    manager_lookup: Callable[..., Any] | None = None


#: The statements whose presence in vLLM's source is a fact: a prompt-tail
#: state already keyed at the boundary is left alone (0.33), and EAGLE
#: groups also retain the block below the shared-prefix junction (0.33).
SKIPS_KEYED_TAIL = "source_block.block_hash_num_tokens == num_tokens"
RETAINS_BELOW_JUNCTION = "request.shared_prefix_boundary - self.block_size"
#: pop_blocks_for_free drops a table's leading null blocks (0.33).
TRIMS_NULL_HEAD = "trim_null_head(req_blocks)"

#: (fact, Observed field, marker, whether the fact holds when the marker is
#: present, where in vLLM) for the facts read from vLLM's source.
SOURCE_FACTS = (
    ("rekeys_keyed_prompt_tail", "mamba_tail_source", SKIPS_KEYED_TAIL, False,
     "MambaManager._cache_partial_tail_block"),
    ("eagle_retains_block_below_junction", "cache_blocks_source", RETAINS_BELOW_JUNCTION, True,
     "SingleTypeKVCacheManager.cache_blocks"),
    ("pops_null_blocks", "pop_source", TRIMS_NULL_HEAD, False, "pop_blocks_for_free"),
)  # fmt: skip


def _vllm_hasher() -> Callable[..., Any]:
    """vLLM's own ``get_request_block_hasher`` (also while kvcoord is enabled)."""
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    original: Callable[..., Any] = _patch._original_hasher.get(
        utils.__name__, getattr(utils, _patch._HASHER)
    )
    return original


def _request(rid: str, tokens: list[int]) -> Request:
    params = SamplingParams(max_tokens=1000)
    params.update_from_generation_config({}, eos_token_id=100)
    hasher = _vllm_hasher()(BS, sha256)  # both releases take these two
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        sampling_params=params,
        pooling_params=None,
        block_hasher=hasher,
    )


def _config(is_eagle_group: bool = False, num_blocks: int = 32) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec, is_eagle_group=is_eagle_group)],
    )


def _manager_args(**kw: Any) -> dict[str, Any]:
    """``kw`` and the required arguments, those the installed vLLM's
    ``KVCacheManager`` takes."""
    names = inspect.signature(kv.original_manager_class().__init__).parameters
    args = {"max_model_len": 256, "scheduler_block_size": BS, "hash_block_size": BS, **kw}
    return {k: v for k, v in args.items() if k in names}


def hit_tokens(cls: type, is_eagle_group: bool, use_eagle: bool) -> int:
    """Tokens a second identical 13-token prompt hits on a fresh manager of
    ``cls`` after the first was computed and freed (3 full blocks cached)."""
    init_none_hash(sha256)
    cfg = _config(is_eagle_group)
    manager = cls(cfg, **_manager_args(enable_caching=True, use_eagle=use_eagle))
    tokens = list(range(3 * BS + 1))
    first = _request("first", tokens)
    blocks, _, *_ = manager.get_computed_blocks(first)
    assert manager.allocate_slots(first, len(tokens), 0, blocks) is not None
    first.num_computed_tokens = len(tokens)
    manager.free(first)
    _, hit, *_ = manager.get_computed_blocks(_request("second", tokens))
    return int(hit)


def observe() -> Observed:
    vllm = importlib.import_module("vllm")
    theirs = kv.original_manager_class()
    managers = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    return Observed(
        version=str(vllm.__version__),
        manager_init=theirs.__init__,
        block_hasher=_vllm_hasher(),
        eagle_hits={(e, u): hit_tokens(theirs, e, u) for e in (False, True) for u in (False, True)},
        mamba_tail_source=inspect.getsource(managers.MambaManager._cache_partial_tail_block),
        cache_blocks_source=inspect.getsource(managers.SingleTypeKVCacheManager.cache_blocks),
        pop_source=inspect.getsource(managers.SingleTypeKVCacheManager.pop_blocks_for_free),
        manager_lookup=theirs.get_computed_blocks,
    )


def _takes(fn: Callable[..., Any], *args: Any) -> bool:
    try:
        inspect.signature(fn).bind(*args)
    except TypeError:
        return False
    return True


def fact_drift(api: _versions.VllmApi, seen: Observed) -> list[str]:
    """How ``api`` (kvcoord's facts) differs from the vLLM ``seen``."""
    out: list[str] = []
    if api.version != seen.version:
        out.append(f"version: kvcoord read {api.version!r}, vLLM is {seen.version!r}")
    series = ".".join(seen.version.split("+")[0].split(".")[:2])
    if series not in _versions.SUPPORTED:
        out.append(
            f"version: vLLM {seen.version} is not a served release "
            f"(_versions.SUPPORTED = {_versions.SUPPORTED}); kvcoord applies "
            f"{_versions.SUPPORTED[-1]}'s facts"
        )
    params = list(inspect.signature(seen.manager_init).parameters.values())
    names = tuple(p.name for p in params if p.name != "self")
    if names != api.manager_arg_names:
        lost = [n for n in api.manager_arg_names if n not in names]
        new = [n for n in names if n not in api.manager_arg_names]
        out.append(
            f"manager_arg_names: kvcoord {api.manager_arg_names}, vLLM's KVCacheManager.__init__ "
            f"{names} (vLLM dropped {lost}, added {new}"
            + (", reordered" if not lost and not new else "")
            + ")"
        )
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            out.append(f"manager_arg_names: vLLM's KVCacheManager.__init__ takes {p}")
    # kvcoord calls vLLM's hasher with the lookahead third, by position, or not at all.
    takes = _takes(seen.block_hasher, 1, 2, 3)
    if takes != api.hasher_takes_lookahead:
        out.append(
            f"hasher_takes_lookahead: kvcoord {api.hasher_takes_lookahead}, vLLM's "
            f"get_request_block_hasher{inspect.signature(seen.block_hasher)}"
        )
    # kvcoord's replacement (kvcoord.vllm.serve._hasher) takes vLLM's parameters, in order.
    theirs = list(inspect.signature(seen.block_hasher).parameters)
    ours = list(inspect.signature(_hasher.make_block_hasher(seen.block_hasher)).parameters)
    if ours[: len(theirs)] != theirs:
        out.append(f"hasher: vLLM's get_request_block_hasher takes {theirs}, kvcoord's {ours}")
    if not _takes(seen.block_hasher, 1, 2):
        out.append(
            "hasher: vLLM's get_request_block_hasher"
            f"{inspect.signature(seen.block_hasher)} no longer takes (hash_block_size, hash_fn)"
        )
    full = seen.eagle_hits[(False, False)]
    drops = {k: hit < full for k, hit in seen.eagle_hits.items()}
    if not drops[(True, True)]:
        out.append(
            f"EAGLE: vLLM's manager no longer drops a flagged group's block: {seen.eagle_hits}"
        )
    needs = not drops[(True, False)]
    if needs != api.eagle_drop_needs_use_eagle:
        out.append(
            f"eagle_drop_needs_use_eagle: kvcoord {api.eagle_drop_needs_use_eagle}, vLLM's manager "
            f"{'keeps' if needs else 'drops'} an is_eagle_group group's last hit block without "
            f"use_eagle (hit tokens by (is_eagle_group, use_eagle): {seen.eagle_hits})"
        )
    # Rules read from vLLM's source (their cases need Mamba kernels or a
    # retention interval with EAGLE; the engine tests run the first).
    for fact, field, marker, holds_when_present, where in SOURCE_FACTS:
        present = marker in getattr(seen, field)
        if (present == holds_when_present) != getattr(api, fact):
            out.append(
                f"{fact}: kvcoord {getattr(api, fact)}, vLLM's {where} "
                f"{'has' if present else 'lacks'} `{marker}`"
            )
    if seen.manager_lookup is not None:
        capped = "max_cache_hit_length" in inspect.signature(seen.manager_lookup).parameters
        if capped != api.lookup_takes_max_cache_hit_length:
            out.append(
                f"lookup_takes_max_cache_hit_length: kvcoord "
                f"{api.lookup_takes_max_cache_hit_length}, vLLM's get_computed_blocks"
                f"{inspect.signature(seen.manager_lookup)}"
            )
    return out


def kvcoord_eagle_drift(seen: Observed) -> list[str]:
    """kvcoord's manager hits what vLLM's does, for each EAGLE case."""
    out = []
    for (e, u), theirs in seen.eagle_hits.items():
        ours = hit_tokens(kv.KVCacheManager, e, u)
        if ours != theirs:
            out.append(
                f"EAGLE: is_eagle_group={e}, use_eagle={u}: "
                f"kvcoord hits {ours} tokens, vLLM {theirs}"
            )
    return out


# --------------------------------------------------------------------------
# 2. The vLLM modules and attributes kvcoord.vllm reads


def _is_import_module(node: ast.AST) -> bool:
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id == "import_module"
    )


def _returned_import(fn: ast.FunctionDef) -> ast.expr | None:
    """The argument of ``return importlib.import_module(<arg>)``, the one
    statement of a helper, or None."""
    body = [
        s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if len(body) == 1 and isinstance(body[0], ast.Return) and _is_import_module(body[0].value):
        call = body[0].value
        assert isinstance(call, ast.Call)
        return call.args[0] if call.args else None
    return None


def _iter_strings(node: ast.AST, position: int | None, consts: dict[str, list[str]]) -> list[str]:
    """The strings a loop over ``node`` binds (``position``: of each tuple)."""
    if isinstance(node, ast.Name) and position is None:
        return consts.get("*" + node.id, [])
    if not isinstance(node, ast.Tuple | ast.List | ast.Set):
        return []
    out = []
    for elt in node.elts:
        if position is not None and isinstance(elt, ast.Tuple) and position < len(elt.elts):
            elt = elt.elts[position]
        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
            out.append(elt.value)
    return out


class _Scope:
    """Names bound in one function (and the module): to a vLLM object's path
    or to known strings."""

    def __init__(self, parent: _Scope | None = None) -> None:
        self.paths: dict[str, list[Read]] = dict(parent.paths) if parent else {}
        self.strings: dict[str, list[str]] = dict(parent.strings) if parent else {}
        self.hasattrs: set[tuple[str, str]] = set()


class _ReadScanner:
    """The vLLM reads of one kvcoord module's source."""

    def __init__(self, source: str, filename: str) -> None:
        self.tree = ast.parse(source, filename)
        self.filename = filename
        self.reads: dict[Read, list[int]] = defaultdict(list)
        self.helpers: dict[str, ast.expr | str] = {}  # name -> module literal, or "param"
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                arg = _returned_import(node)
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("vllm"):
                    self.helpers[node.name] = arg
                elif isinstance(arg, ast.Name) and [a.arg for a in node.args.args[:1]] == [arg.id]:
                    self.helpers[node.name] = "param"
        self.parents = {c: p for p in ast.walk(self.tree) for c in ast.iter_child_nodes(p)}
        # ``self.<name> = <vLLM object>`` in any method (``self._kv = _vllm(...)``).
        self.self_attrs: dict[str, list[Read]] = {}
        module = _Scope()
        self._fill(self.tree.body, module)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        paths = self.resolve(node.value, module)
                        if paths:
                            self.self_attrs[t.attr] = paths

    # -- strings
    def strings(self, node: ast.AST, scope: _Scope) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name):
            return scope.strings.get(node.id, [])
        return []

    def _in_try(self, node: ast.AST) -> bool:
        while node in self.parents:
            parent = self.parents[node]
            if isinstance(parent, ast.Try) and node in parent.body and parent.handlers:
                return True
            node = parent
        return False

    # -- paths
    def resolve(self, node: ast.AST, scope: _Scope) -> list[Read]:
        """The vLLM objects ``node`` evaluates to (one per possible name)."""
        if isinstance(node, ast.Call):
            f = node.func
            if _is_import_module(node) and node.args:
                optional = self._in_try(node)
                return [
                    Read(m, module_optional=optional)
                    for m in self.strings(node.args[0], scope)
                    if m == "vllm" or m.startswith("vllm.")
                ]
            if isinstance(f, ast.Name) and f.id in self.helpers:
                helper = self.helpers[f.id]
                if isinstance(helper, ast.Constant):
                    return [Read(str(helper.value))]
                if node.args:
                    return [
                        Read(m) for m in self.strings(node.args[0], scope) if m.startswith("vllm")
                    ]
            if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2:
                base = self.resolve(node.args[0], scope)
                names = self.strings(node.args[1], scope)
                key = ast.dump(node.args[0])
                return [
                    dataclasses.replace(
                        r,
                        attrs=(*r.attrs, n),
                        optional=r.optional
                        or len(node.args) == 3
                        or (key, ast.dump(node.args[1])) in scope.hasattrs,
                    )
                    for r in base
                    for n in names
                ]
            return []
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and node.attr in self.self_attrs
        ):
            return self.self_attrs[node.attr]
        if isinstance(node, ast.Attribute) and not node.attr.startswith("__"):
            return [
                dataclasses.replace(r, attrs=(*r.attrs, node.attr))
                for r in self.resolve(node.value, scope)
            ]
        if isinstance(node, ast.Name):
            return scope.paths.get(node.id, [])
        return []

    def _bind(self, target: ast.AST, value: ast.AST, scope: _Scope) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._bind(t, v, scope)
        elif isinstance(target, ast.Name):
            paths = self.resolve(value, scope)
            if paths:
                scope.paths[target.id] = paths
            strings = self.strings(value, scope)
            if strings and not isinstance(value, ast.Name):
                scope.strings[target.id] = strings
            if isinstance(value, ast.Tuple | ast.List):
                scope.strings["*" + target.id] = _iter_strings(value, None, scope.strings)

    def _loop(self, target: ast.AST, iterable: ast.AST, scope: _Scope) -> None:
        if isinstance(target, ast.Name):
            names = [(target.id, None)]
        elif isinstance(target, ast.Tuple):
            names = [(t.id, i) for i, t in enumerate(target.elts) if isinstance(t, ast.Name)]
        else:
            return
        for name, position in names:
            strings = _iter_strings(iterable, position, scope.strings)
            if strings:
                scope.strings[name] = strings

    def _fill(self, body: Iterable[ast.AST], scope: _Scope) -> None:
        """Bind the names assigned in ``body`` (not in nested functions)."""
        stack = list(body)
        while stack:
            node = stack.pop(0)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                continue
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    self._bind(t, node.value, scope)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                self._bind(node.target, node.value, scope)
            elif isinstance(node, ast.For | ast.comprehension):
                self._loop(node.target, node.iter, scope)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "hasattr"
                and len(node.args) == 2
            ):
                scope.hasattrs.add((ast.dump(node.args[0]), ast.dump(node.args[1])))
            stack.extend(ast.iter_child_nodes(node))

    def _record(self, body: Iterable[ast.AST], scope: _Scope) -> None:
        stack = list(body)
        while stack:
            node = stack.pop(0)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self._function(node, scope)
                continue
            if isinstance(node, ast.Attribute | ast.Call):
                line = getattr(node, "lineno", 0)
                for r in self.resolve(node, scope):
                    if r.attrs:
                        self.reads[r].append(line)
                parent = self.parents.get(node)
                if isinstance(parent, ast.Call) and parent.func is node:
                    for r in self.resolve(node, scope):
                        self.reads[dataclasses.replace(r, call=Call.of(parent))].append(line)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "hasattr"
                and len(node.args) == 2
            ):
                for r in self.resolve(node.args[0], scope):
                    for n in self.strings(node.args[1], scope):
                        self.reads[dataclasses.replace(r, attrs=(*r.attrs, n), optional=True)]
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                module, sep, name = node.value.partition(":")
                if sep and module.startswith("vllm.") and name.isidentifier():
                    self.reads[Read(module, (name,))].append(getattr(node, "lineno", 0))
            stack.extend(ast.iter_child_nodes(node))

    def _function(
        self, fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, outer: _Scope
    ) -> None:
        scope = _Scope(outer)
        body = fn.body if isinstance(fn.body, list) else [fn.body]
        self._fill(body, scope)
        self._record(body, scope)

    def scan(self) -> dict[Read, list[int]]:
        module = _Scope()
        self._fill(self.tree.body, module)
        self._record(self.tree.body, module)
        return self.reads


def kvcoord_reads(sources: dict[str, str]) -> dict[Read, list[str]]:
    """Every vLLM read in ``sources`` (file name -> source), with where."""
    out: dict[Read, list[str]] = defaultdict(list)
    for filename, source in sorted(sources.items()):
        for read, lines in _ReadScanner(source, filename).scan().items():
            out[read] += [f"{filename}:{n}" for n in sorted(set(lines)) if n]
    return out


def _kvcoord_sources() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


#: Facts that guard reads: kvcoord reaches those reads only on a vLLM where
#: the fact holds (read from ``_versions.installed()``).
FACTS: dict[str, Callable[[_versions.VllmApi], bool]] = {
    # The manager's num_hash_lookahead_tokens: what makes kvcoord's `ahead` nonzero.
    "hash lookahead": lambda api: "num_hash_lookahead_tokens" in api.manager_arg_names,
}
#: Scanned reads kvcoord makes only behind a fact (read name -> FACTS key).
GUARDED = {
    # _events.py: only when `self.lookahead` (the manager's hash lookahead).
    "vllm.v1.core.kv_cache_utils:generate_lookahead_block_hash_extra_keys": "hash lookahead",
}


def _dynamic_reads() -> dict[Read, list[str]]:
    """Reads whose names kvcoord computes at run time (not in its source as
    literals), from the kvcoord objects that hold them."""
    out: dict[Read, list[str]] = defaultdict(list)
    interface = _hit_search._interface().__name__
    for cls in vars(_hit_search).values():
        for kind in getattr(cls, "_specs", ()) if isinstance(cls, type) else ():
            out[Read(interface, (kind,))].append(f"_hit_search.py {cls.__name__}._specs")
    for name in _views._VIEW_CLASSES:
        out[Read("vllm.v1.core.kv_cache_coordinator", (name, "register"))].append(
            "_views.py _VIEW_CLASSES"
        )
    # _events.py passes it through **lookahead, with hash lookahead only.
    stored = Read(
        "vllm.distributed.kv_events",
        ("BlockStored",),
        call=Call(0, ("lookahead_token_ids",), star=True),
        when="hash lookahead",
    )
    out[stored].append("_events.py EventLog._build")
    return out


#: The one list of what kvcoord.vllm reads from vLLM: derived from its
#: source, plus the names held in kvcoord objects.
def all_reads() -> dict[Read, list[str]]:
    reads: dict[Read, list[str]] = defaultdict(list)
    for read, where in kvcoord_reads(_kvcoord_sources()).items():
        reads[dataclasses.replace(read, when=GUARDED.get(read.name, read.when))] += where
    for read, where in _dynamic_reads().items():
        reads[read] += where
    return reads


def read_drift(reads: dict[Read, list[str]], api: _versions.VllmApi | None = None) -> list[str]:
    """The reads the installed vLLM (``api``: its facts) does not satisfy,
    one line each; a guarded read only where its fact holds."""
    api = api or _versions.installed()
    out: list[str] = []
    seen: set[str] = set()

    def report(line: str) -> None:
        if line not in seen:
            seen.add(line)
            out.append(line)

    for read, where in sorted(reads.items(), key=lambda kv_: (kv_[0].name, str(kv_[0].call))):
        at = ", ".join(sorted(set(where))[:3]) + (" ..." if len(set(where)) > 3 else "")
        if read.when is not None and not FACTS[read.when](api):
            continue
        try:
            obj: Any = importlib.import_module(read.module)
        except ImportError as e:
            if not read.module_optional:
                report(f"kvcoord reads module {read.module} ({at}): {e}")
            continue
        for i, attr in enumerate(read.attrs):
            if not hasattr(obj, attr):
                if not read.optional:
                    dotted = ".".join(read.attrs[: i + 1])
                    report(f"kvcoord reads {read.module}.{dotted} ({at}): missing")
                break
            obj = getattr(obj, attr)
        else:
            if read.call is not None:
                why = read.call.fails(obj)
                if why is not None:
                    report(f"kvcoord calls {read.name} ({at}): {why}")
    return out


# --------------------------------------------------------------------------
# 3. What the scheduler reads and calls on its KVCacheManager; 4. how it builds it


def _manager_path(node: ast.AST) -> tuple[str, ...] | None:
    """``(a, b)`` for ``self.kv_cache_manager.a.b``, else None."""
    path: list[str] = []
    while isinstance(node, ast.Attribute):
        if (
            node.attr == MANAGER_ATTR
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            return tuple(reversed(path))
        path.append(node.attr)
        node = node.value
    return None


def scheduler_uses(
    source: str, filename: str
) -> tuple[dict[Use, list[str]], dict[Call, list[str]]]:
    """What ``source`` (a scheduler module) reads and calls on
    ``self.kv_cache_manager``, and its ``KVCacheManager(...)`` calls."""
    tree = ast.parse(source, filename)
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    uses: dict[Use, list[str]] = defaultdict(list)
    builds: dict[Call, list[str]] = defaultdict(list)
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
            if name == "KVCacheManager":
                builds[Call.of(node)].append(where)
        if not isinstance(node, ast.Attribute):
            continue
        path = _manager_path(node)
        if not path:
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue  # the longer chain is recorded
        if isinstance(parent, ast.Call) and parent.func is node:
            uses[Use(path, call=Call.of(parent))].append(where)
        else:
            uses[Use(path, store=isinstance(node.ctx, ast.Store | ast.Del))].append(where)
    return uses, builds


def _installed_scheduler_uses() -> tuple[dict[Use, list[str]], dict[Call, list[str]]]:
    uses: dict[Use, list[str]] = defaultdict(list)
    builds: dict[Call, list[str]] = defaultdict(list)
    for name in SCHEDULER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        path = Path(inspect.getsourcefile(module) or "")
        u, b = scheduler_uses(path.read_text(), f"{name.rsplit('.', 1)[-1]}.py")
        for k, v in u.items():
            uses[k] += v
        for k, v in b.items():
            builds[k] += v
    return uses, builds


def _walk(obj: Any, path: Sequence[str]) -> tuple[Any, str | None]:
    for i, attr in enumerate(path):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            return None, ".".join(path[: i + 1])
    return obj, None


def use_drift(uses: dict[Use, list[str]], ours: Any, theirs: Any) -> list[str]:
    """The scheduler's uses ``ours`` (kvcoord's manager) does not serve;
    ``theirs`` (vLLM's) checks the scanner: a use vLLM's own manager fails
    is reported as a scanner problem."""
    out: list[str] = []
    for use, where in sorted(uses.items(), key=lambda kv_: (kv_[0].path, str(kv_[0].call))):
        at = ", ".join(where[:3]) + (" ..." if len(where) > 3 else "")
        theirs_obj, theirs_missing = _walk(theirs, use.path)
        ours_obj, ours_missing = _walk(ours, use.path)
        if theirs_missing is not None and not use.store:
            # Attributes set late (connectors, by a step): nothing to compare.
            if ours_missing is None:
                continue
            out.append(f"scanner: {use.name} ({at}) is not on vLLM's own manager either")
            continue
        if use.store:
            owner, _ = _walk(ours, use.path[:-1])
            try:
                setattr(owner, use.path[-1], getattr(owner, use.path[-1], None))
            except (AttributeError, TypeError) as e:
                out.append(f"the scheduler sets {use.name} ({at}): kvcoord's manager refuses ({e})")
            continue
        if ours_missing is not None:
            out.append(
                f"the scheduler reads {use.name} ({at}): kvcoord's manager has no {ours_missing}"
            )
            continue
        if use.call is None:
            continue
        if use.call.fails(theirs_obj) is not None:
            out.append(f"scanner: {use.name}{use.call} ({at}) does not bind on vLLM's own manager")
            continue
        why = use.call.fails(ours_obj)
        if why is not None:
            out.append(f"the scheduler calls {use.name} ({at}): kvcoord's {why}")
    return out


def build_drift(
    builds: dict[Call, list[str]],
    bind: Callable[[tuple[Any, ...], dict[str, Any]], Any] = _construct.bind_args,
) -> list[str]:
    """The scheduler's ``KVCacheManager(...)`` calls kvcoord's ``bind_args``
    refuses (or none found)."""
    if not builds:
        return ["the scheduler: no KVCacheManager(...) call found (the scanner or vLLM changed)"]
    out = []
    theirs = kv.original_manager_class()
    for call, where in sorted(builds.items(), key=str):
        at = ", ".join(where)
        if call.star:
            out.append(f"the scheduler builds KVCacheManager{call} ({at}) with splatted arguments")
            continue
        if call.fails(theirs) is not None:
            out.append(f"scanner: KVCacheManager{call} ({at}) does not bind on vLLM's own")
        try:
            bind(tuple(object() for _ in range(call.positional)), {k: None for k in call.keywords})
        except TypeError as e:
            out.append(
                f"the scheduler builds KVCacheManager{call} ({at}): kvcoord's bind_args: {e}"
            )
    return out


# --------------------------------------------------------------------------
# The test


def _managers() -> tuple[Any, Any]:
    init_none_hash(sha256)
    theirs_cls = kv.original_manager_class()
    theirs = theirs_cls(_config(), **_manager_args(enable_caching=True))
    ours = kv.KVCacheManager(_config(), **_manager_args(enable_caching=True))
    assert isinstance(ours, kv.KVCacheManager), "kvcoord fell back on a plain configuration"
    return ours, theirs


def drift() -> Iterator[str]:
    seen = observe()
    yield from fact_drift(_versions.installed(), seen)
    yield from kvcoord_eagle_drift(seen)
    yield from read_drift(all_reads())
    uses, builds = _installed_scheduler_uses()
    if not uses:
        yield "the scheduler: no self.kv_cache_manager use found (the scanner or vLLM changed)"
    ours, theirs = _managers()
    yield from use_drift(uses, ours, theirs)
    yield from build_drift(builds)


def test_installed_vllm_is_what_kvcoord_relies_on() -> None:
    problems = list(drift())
    if problems:
        version = importlib.import_module("vllm").__version__
        pytest.fail(
            f"vLLM {version} differs from what kvcoord.vllm relies on "
            f"({len(problems)}):\n" + "\n".join(problems),
            pytrace=False,
        )


def test_the_scan_sees_kvcoords_reads() -> None:
    """The derived list is not empty by accident: it holds reads of each
    kind (a helper's module, a local name, a string ``module:Name``, a loop
    over a tuple of names, an import in a try, a call)."""
    names = {r.name for r in all_reads()}
    for expected in (
        "vllm.v1.kv_cache_interface:MambaSpec",  # _mamba._interface().MambaSpec
        "vllm.v1.kv_cache_interface:get_kv_cache_spec_kind",  # _events._vllm(name)
        "vllm.v1.request:RequestStatus.WAITING",  # a name bound to an attribute
        "vllm.v1.core.block_pool:BlockPool",  # vllm_class = "module:Name"
        "vllm.v1.core.sched.scheduler:KVCacheManager",  # for name in _TARGETS
        "vllm.v1.core.kv_cache_utils:get_request_block_hasher",  # getattr(utils, _HASHER)
        "vllm.v1.engine.core:get_request_block_hasher",  # imported in a try
        "vllm.v1.core.single_type_kv_cache_manager:HiSparseSourceManager.register",
        "vllm.v1.core.kv_cache_coordinator:HybridKVCacheCoordinator.register",  # dynamic
    ):
        assert expected in names, expected
    calls = {r.name for r in all_reads() if r.call is not None and r.call.keywords}
    assert "vllm.v1.core.kv_cache_utils:KVCacheBlockCopy" in calls
    uses, builds = _installed_scheduler_uses()
    paths = {u.path for u in uses}
    assert paths >= {("allocate_slots",), ("coordinator", "get_num_blocks_to_allocate")}
    assert builds


# --------------------------------------------------------------------------
# Negative controls: each checker reports a drifted input


def test_fact_drift_sees_drifted_facts() -> None:
    seen = observe()
    api = _versions.installed()
    assert fact_drift(api, seen) == []

    def hasher_kw_only(hash_block_size: int, hash_fn: Any, *, lookahead: int = 0) -> None: ...

    def init_new_arg(self: Any, *names: Any, brand_new: int = 0) -> None: ...

    drifted = dataclasses.replace(
        seen,
        version="0.99.0",
        manager_init=init_new_arg,
        block_hasher=hasher_kw_only,
        eagle_hits={**seen.eagle_hits, (True, False): seen.eagle_hits[(True, False)] + BS},
    )
    claimed = dataclasses.replace(api, version="0.99.0", hasher_takes_lookahead=True)
    found = "\n".join(fact_drift(claimed, drifted))
    assert "0.99.0 is not a served release" in found
    assert "manager_arg_names: kvcoord" in found and "added ['names', 'brand_new']" in found
    assert "takes *names" in found
    assert "hasher_takes_lookahead: kvcoord True" in found
    assert "kvcoord's ['hash_block_size', 'caching_hash_fn'" in found  # hash_fn renamed
    for fact in (
        "eagle_drop_needs_use_eagle",
        "rekeys_keyed_prompt_tail",
        "eagle_retains_block_below_junction",
        "pops_null_blocks",
        "lookup_takes_max_cache_hit_length",
    ):
        flipped = dataclasses.replace(api, **{fact: not getattr(api, fact)})
        assert any(line.startswith(fact) for line in fact_drift(flipped, seen)), fact


def test_read_drift_sees_missing_and_misbound_reads() -> None:
    source = """
import importlib
from typing import Any

def _iface():
    return importlib.import_module("vllm.v1.kv_cache_interface")

def f():
    interface: Any = importlib.import_module("vllm.v1.kv_cache_interface")
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    ok = getattr(interface, "NoSuchOptionalSpec", None)
    if hasattr(interface, "NoSuchGuarded"):
        getattr(interface, "NoSuchGuarded")
    utils.KVCacheBlockCopy(src_block_id=1, no_such_field=2)
    return interface.NoSuchSpec, _iface().FullAttentionSpec.no_such_attr

class Log:
    def __init__(self):
        self._kv = importlib.import_module("vllm.distributed.kv_events")

    def build(self):
        return self._kv.NoSuchEvent(), self._kv.BlockStored(no_such_kw=1)

def g():
    for name in ("NoSuchManager", "FullAttentionManager"):
        getattr(importlib.import_module("vllm.v1.core.single_type_kv_cache_manager"), name)
    importlib.import_module("vllm.no_such_module").x
    return "vllm.v1.core.block_pool:NoSuchPool"
"""
    found = read_drift(kvcoord_reads({"fake.py": source}))
    text = "\n".join(found)
    assert "vllm.v1.kv_cache_interface.NoSuchSpec (fake.py:15): missing" in text
    assert "vllm.v1.kv_cache_interface.FullAttentionSpec.no_such_attr" in text
    assert "vllm.v1.core.single_type_kv_cache_manager.NoSuchManager" in text
    assert "FullAttentionManager" not in text
    assert "module vllm.no_such_module" in text
    assert "vllm.v1.core.block_pool.NoSuchPool" in text
    assert "kvcoord calls vllm.v1.core.kv_cache_utils:KVCacheBlockCopy" in text
    assert "no_such_field" in text
    assert "NoSuchOptionalSpec" not in text and "NoSuchGuarded" not in text
    assert "vllm.distributed.kv_events.NoSuchEvent" in text  # held on self
    assert "kvcoord calls vllm.distributed.kv_events:BlockStored" in text
    assert len(found) == 8, text

    # A guarded read is checked only where its fact holds.
    missing = Read("vllm.v1.core.kv_cache_utils", ("no_such_lookahead_fn",), when="hash lookahead")
    api = _versions.installed()
    with_fact = dataclasses.replace(
        api, manager_arg_names=(*api.manager_arg_names, "num_hash_lookahead_tokens")
    )
    without = dataclasses.replace(
        api, manager_arg_names=tuple(n for n in api.manager_arg_names if "lookahead" not in n)
    )
    assert read_drift({missing: ["fake.py:1"]}, without) == []
    assert read_drift({missing: ["fake.py:1"]}, with_fact) == [
        "kvcoord reads vllm.v1.core.kv_cache_utils.no_such_lookahead_fn (fake.py:1): missing"
    ]


def test_use_drift_sees_a_changed_scheduler() -> None:
    source = """
class Scheduler:
    def __init__(self):
        self.kv_cache_manager = KVCacheManager(kv_cache_config=1, max_model_len=2,
            scheduler_block_size=3, hash_block_size=4, brand_new_arg=5)

    def schedule(self, request):
        self.kv_cache_manager.allocate_slots(request, 1, brand_new_kw=True)
        self.kv_cache_manager.free(request, 1, 2)
        self.kv_cache_manager.get_computed_blocks(request)
        self.kv_cache_manager.coordinator.single_type_managers
        return self.kv_cache_manager.usage, self.kv_cache_manager.empty_kv_cache_blocks.blocks
"""
    uses, builds = scheduler_uses(source, "fake.py")
    ours, theirs = _managers()

    class Fake:
        """vLLM's manager with a method kvcoord's lacks."""

        def __init__(self, real: Any) -> None:
            self._real = real

        def brand_new_method(self) -> None: ...

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

    uses[Use(("brand_new_method",), call=Call(0))].append("fake.py:99")
    text = "\n".join(use_drift(uses, ours, Fake(theirs)))
    assert "kvcoord's manager has no brand_new_method" in text
    # A keyword vLLM's own manager does not take either is the scanner's (or
    # the fake's) problem, not kvcoord's: reported as such.
    assert "scanner: kv_cache_manager.allocate_slots(2 positional, brand_new_kw=)" in text
    assert "scanner: kv_cache_manager.free(3 positional)" in text
    assert "get_computed_blocks" not in text and "usage" not in text
    assert len(text.splitlines()) == 3, text

    # A call vLLM's manager takes and kvcoord's does not.
    class Narrow:
        def __init__(self, real: Any) -> None:
            self._real = real

        def get_computed_blocks(self) -> None: ...

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

    text = "\n".join(use_drift(uses, Narrow(ours), theirs))
    assert "the scheduler calls kv_cache_manager.get_computed_blocks (fake.py:10): " in text

    found = build_drift(builds)
    assert any("unexpected keyword argument 'brand_new_arg'" in line for line in found), found
    assert build_drift({}) != []
