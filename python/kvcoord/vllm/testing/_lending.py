"""Which of vLLM's classes a test may get kvcoord's stand-in for: the rule
the pytest plugin (:mod:`kvcoord.vllm.pytest_plugin`) applies to every test.

A stand-in class (:class:`kvcoord.vllm.BlockPool`, the hit-search managers
of :mod:`kvcoord.vllm.testing._hit_search`) declares what it stands for and what it
serves:

* ``vllm_class``: vLLM's class, ``"module:Name"``;
* ``vllm_hands_out``: vLLM's classes of the objects it hands out (a pool's
  blocks, free queue and cache index), whose names a test uses on those;
* ``vllm_serves``: the names of that surface it serves, to read or call
  (none is served for assignment);
* ``vllm_needs``: vLLM's classes whose stand-ins must be lent with it (a
  hit-search manager runs over kvcoord's pool only).

vLLM's surface of a class is every name it has: its class attributes and
the attributes its methods (and those of its bases) assign, dunders aside.

A test gets kvcoord's class for a name its module binds to vLLM's class
when, over the test's code (the function, nested functions and
comprehensions, its class's methods, its fixtures, and every function,
class or module of the test tree they reach by name, recursively):

1. the code names the stand-in's name (a global of the test module);
2. every name it uses (attribute names and identifier strings, keyword
   names among them) that is in vLLM's surface of that class is served,
   and it assigns or deletes none of them (nor sets them through
   ``setattr``, ``monkeypatch`` or ``mock.patch``: with those in the code,
   identifier strings count as assignments);
3. every class a stand-in needs is lent too;
4. nothing it reaches otherwise (another module's global, a module
   attribute, a parameter value, a default) is a vLLM class or function
   that stands on a pool: a subclass of a stand-in's vLLM class, a class
   with a ``block_pool`` attribute (single-type managers, coordinators) or
   a callable taking a ``block_pool``; those would put vLLM's code over
   kvcoord's pool, or vLLM's pool under kvcoord's code.

The names are lent together or not at all. Anything the scan cannot read
(a builtin, a C function) adds no name, which is why rule 4 refuses any
pool-bound vLLM callable reached: its own code is not read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import dis
import functools
import importlib
import inspect
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "Scan",
    "decide",
    "lend",
    "pool_bound",
    "scan",
    "stand_ins",
    "vllm_surface",
    "writes_manager_state",
]

_PATCHING = frozenset({"setattr", "delattr", "patch", "monkeypatch", "mocker", "MagicMock", "Mock"})
_SKIPPED_PACKAGES = frozenset({"vllm", "kvcoord", "_pytest", "pytest", "torch"})


def _resolve(dotted: str) -> Any:
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def stand_ins() -> dict[type, type]:
    """vLLM's class -> kvcoord's stand-in, for every stand-in."""
    from kvcoord.vllm.testing import _hit_search, _pool

    ours = (
        _pool.BlockPool,
        _hit_search.FullAttentionManager,
        _hit_search.SlidingWindowManager,
        _hit_search.ChunkedLocalAttentionManager,
    )
    return {_resolve(cls.vllm_class): cls for cls in ours}


def _code_objects(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _strings(const: Any) -> Iterable[str]:
    if isinstance(const, str):
        for part in const.split("."):
            if part.isidentifier():
                yield part
    elif isinstance(const, tuple | frozenset):
        for c in const:
            yield from _strings(c)


@functools.cache
def vllm_surface(cls: type) -> frozenset[str]:
    """Every non-dunder name of ``cls``: class attributes, dataclass fields,
    slots, and the attributes its methods and its bases' assign."""
    names = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names.update(f.name for f in dataclasses.fields(cls))
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(getattr(klass, "__slots__", ()))
        for value in vars(klass).values():
            fn = _function_of(value)
            if fn is None:
                continue
            names |= _own_stores(fn.__code__)
    return frozenset(n for n in names if not (n.startswith("__") and n.endswith("__")))


def _own_stores(code: types.CodeType) -> set[str]:
    """The attributes a method assigns, but those it assigns on another
    local (``block.ref_cnt = 0`` is a block's, not the class's)."""
    own = code.co_varnames[0] if code.co_argcount else None
    out: set[str] = set()
    for inner in _code_objects(code):
        previous = None
        for ins in dis.get_instructions(inner):
            if ins.opname == "STORE_ATTR":
                other_local = (
                    previous is not None
                    and previous.opname == "LOAD_FAST"
                    and previous.argval != own
                )
                if not other_local:
                    out.add(str(ins.argval))
            previous = ins
    return out


def _function_of(value: Any) -> types.FunctionType | None:
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    value = inspect.unwrap(value) if callable(value) else value
    return value if isinstance(value, types.FunctionType) else None


def _is_vllm(obj: Any) -> bool:
    return str(getattr(obj, "__module__", None) or "").split(".")[0] == "vllm"


def pool_bound(obj: Any) -> bool:
    """Whether ``obj`` is vLLM code that stands on a block pool: a class with
    an attribute named ``*block_pool`` (``block_pool``, ``cpu_block_pool``...)
    or a method taking one (a constructor, ``bind_gpu_block_pool``), or a
    function taking a block pool."""
    if not _is_vllm(obj) or not callable(obj):
        return False
    if isinstance(obj, type):
        if any(n.endswith("block_pool") for n in vllm_surface(obj)):
            return True
        methods = [
            fn
            for k in obj.__mro__
            if k is not object
            for v in vars(k).values()
            if (fn := _function_of(v)) is not None
        ]
        return any(_takes_pool(f, typed=False) for f in methods)
    return _takes_pool(obj, typed=True)


def _takes_pool(fn: Any, typed: bool) -> bool:
    """Whether ``fn`` has a ``*block_pool`` parameter (or, ``typed``, one
    annotated as a ``BlockPool``: not for methods, as vLLM's blocks keep
    their pool for deferred frees)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.name.endswith("block_pool") or (typed and "BlockPool" in str(p.annotation))
        for p in params
    )


@dataclasses.dataclass
class Scan:
    """What a test's code does: the names it uses and assigns, and the
    objects it reaches, each with the namespace it was read from (None for
    a value: a parameter, a default, a closure cell)."""

    uses: set[str] = dataclasses.field(default_factory=set)
    stores: set[str] = dataclasses.field(default_factory=set)
    # Attributes the code stores items into (``x.table[key] = v``).
    item_stores: set[str] = dataclasses.field(default_factory=set)
    reached: list[tuple[Any, Mapping[str, Any] | None, str]] = dataclasses.field(
        default_factory=list
    )


def _names(code: types.CodeType) -> tuple[set[str], set[str], set[str], set[str]]:
    """The names ``code`` reads as globals, reads as attributes, assigns or
    deletes as attributes, and stores items into as attributes
    (``x.table[key] = v`` with a one-instruction key: ``table``); a name of
    ``co_names`` that no known instruction accounts for counts as the first
    two."""
    globals_: set[str] = set()
    attrs: set[str] = set()
    stores: set[str] = set()
    item_stores: set[str] = set()
    recent: list[dis.Instruction] = []
    for ins in dis.get_instructions(code):
        op = ins.opname
        if "ATTR" in op or op == "LOAD_METHOD":
            (stores if op.startswith(("STORE", "DELETE")) else attrs).add(str(ins.argval))
        elif "GLOBAL" in op or op.endswith("_NAME"):
            globals_.add(str(ins.argval))
        elif (
            op in ("STORE_SUBSCR", "DELETE_SUBSCR")
            and len(recent) == 2
            and recent[0].opname == "LOAD_ATTR"
        ):
            item_stores.add(str(recent[0].argval))
        recent = [*recent[-1:], ins]
    unknown = set(code.co_names) - globals_ - attrs - stores
    return globals_ | unknown, attrs | unknown, stores, item_stores


class _Scanner:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.out = Scan()
        self.seen: set[int] = set()
        self.modules: list[types.ModuleType] = []
        self.resolved: set[tuple[int, str]] = set()
        self.attrs: set[str] = set()  # names read as attributes, or as strings

    def in_tree(self, module_name: str, filename: str | None) -> bool:
        if module_name.split(".")[0] in _SKIPPED_PACKAGES or not filename:
            return False
        path = Path(filename).resolve()
        return "site-packages" not in path.parts and path.is_relative_to(self.root)

    def visit(
        self, obj: Any, namespace: Mapping[str, Any] | None, name: str, depth: int = 0
    ) -> None:
        if isinstance(obj, list | tuple | set | frozenset | dict):
            if depth < 4:
                for o in obj.values() if isinstance(obj, dict) else obj:
                    self.visit(o, None, "", depth + 1)
            return
        if isinstance(obj, functools.partial):
            self.visit([obj.func, *obj.args, *obj.keywords.values()], None, "", depth)
            return
        if not isinstance(obj, type | types.ModuleType) and not callable(obj):
            if not _is_vllm(type(obj)):
                return
            obj = type(obj)  # a vLLM object as a value: its class counts
        self.out.reached.append((obj, namespace, name))
        if id(obj) in self.seen:
            return
        self.seen.add(id(obj))
        if isinstance(obj, types.MethodType):
            self.visit(obj.__func__, None, "", depth)
        elif isinstance(obj, types.ModuleType):
            if obj.__name__.split(".")[0] == "vllm" or self.in_tree(
                obj.__name__, getattr(obj, "__file__", None)
            ):
                self.modules.append(obj)
        elif isinstance(obj, type):
            if self.in_tree(obj.__module__, _file_of(obj)):
                for value in vars(obj).values():
                    fn = _function_of(value)
                    if fn is not None:
                        self.visit(fn, None, "", depth)
        else:
            fn = _function_of(obj)
            if fn is not None and self.in_tree(fn.__module__ or "", fn.__code__.co_filename):
                self.walk(fn)

    def walk(self, fn: types.FunctionType) -> None:
        out = self.out
        for code in _code_objects(fn.__code__):
            globals_, attrs, stores, item_stores = _names(code)
            out.uses |= globals_ | attrs | stores
            out.stores |= stores
            out.item_stores |= item_stores
            self.attrs |= attrs
            # A string naming a local is pytest's assertion rewriting
            # showing that local, not a getattr.
            local = {*code.co_varnames, *code.co_cellvars, *code.co_freevars}
            for const in code.co_consts:
                strings = set(_strings(const)) - local
                out.uses |= strings
                self.attrs |= strings
            for name in globals_:
                if name in fn.__globals__:
                    self.visit(fn.__globals__[name], fn.__globals__, name)
        for value in (fn.__defaults__ or (), *(fn.__kwdefaults__ or {}).values()):
            self.visit(value, None, "")
        for cell in fn.__closure__ or ():
            with contextlib.suppress(ValueError):  # an empty cell
                self.visit(cell.cell_contents, None, "")

    def finish(self) -> Scan:
        """Follow the module attributes the code reads until nothing new is reached."""
        grown = True
        while grown:
            grown = False
            for module in list(self.modules):
                for name in sorted(self.attrs):
                    key = (id(module), name)
                    if key in self.resolved or name not in vars(module):
                        continue
                    self.resolved.add(key)
                    grown = True
                    # Read through the module object, not as a global of a
                    # test module (the globals the plugin rebinds).
                    self.visit(vars(module)[name], None, f"{module.__name__}.{name}")
        return self.out


def _file_of(obj: Any) -> str | None:
    try:
        return inspect.getsourcefile(obj)
    except TypeError:
        return None


def scan(
    roots: Iterable[Any],
    values: Iterable[Any] = (),
    root: Path | str = ".",
    names: Iterable[str] = (),
) -> Scan:
    """The scan of the functions/classes ``roots`` (a test, its class, its
    fixtures) and the parameter ``values``, reading the code under ``root``;
    ``names`` (the test's fixture names) count as used."""
    scanner = _Scanner(Path(root).resolve())
    scanner.out.uses.update(names)
    for obj in roots:
        scanner.visit(obj, None, "")
    for value in values:
        scanner.visit(value, None, "")
    out = scanner.finish()
    if out.uses & _PATCHING:
        out.stores |= {s for s in out.uses if s.isidentifier()}
    return out


@functools.cache
def _manager_state() -> frozenset[str]:
    """The names of vLLM's single-type managers' state: every name of their
    surface (:func:`vllm_surface`) that is not a method."""
    module = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    base = module.SingleTypeKVCacheManager
    names: set[str] = set()
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, base):
            names |= {n for n in vllm_surface(value) if not callable(getattr(value, n, None))}
    return frozenset(names)


def writes_manager_state(found: Scan) -> str:
    """Why no drop-in can serve the test scanned as ``found``: the names of
    vLLM's single-type managers' state it writes, items stored into one
    (``req_to_blocks[...] = ...``) or a private one assigned (it builds
    vLLM's internal state by hand and reads back what vLLM's code makes of
    it), or empty. A public name assigned (``block_size``) is not counted:
    specs and configs have the same names."""
    state = _manager_state()
    private = {n for n in found.stores if n.startswith("_")}
    return ", ".join(sorted((found.item_stores | private) & state))


def lend(module: Any, found: Scan) -> dict[str, type]:
    """kvcoord's class for each name of ``module`` to rebind during the test
    scanned as ``found`` (empty: the test keeps vLLM's classes)."""
    return decide(module, found)[0]


def decide(module: Any, found: Scan) -> tuple[dict[str, type], str]:
    """:func:`lend`, with why not (empty when lent, or nothing to lend)."""
    ours = stand_ins()
    namespace = vars(module)
    lent: dict[str, type] = {}
    named = {name for obj, ns, name in found.reached if ns is namespace}
    for name in sorted(named):
        vllm_cls = namespace.get(name)
        cls = ours.get(vllm_cls) if isinstance(vllm_cls, type) else None
        if cls is None:
            continue
        surface = set(vllm_surface(vllm_cls))
        for other, via in cls.vllm_hands_out.items():  # type: ignore[attr-defined]
            if not via or via in found.uses:
                surface |= vllm_surface(_resolve(other))
        unserved = (found.uses & surface) - cls.vllm_serves  # type: ignore[attr-defined]
        if unserved:
            return {}, f"{name}: uses {', '.join(sorted(unserved))}"
        if found.stores & surface:
            return {}, f"{name}: assigns {', '.join(sorted(found.stores & surface))}"
        lent[name] = cls
    given = {namespace[name] for name in lent}
    for name, cls in lent.items():
        for need in cls.vllm_needs:  # type: ignore[attr-defined]
            if _resolve(need) not in given:
                return {}, f"{name}: needs {need} lent too"
    for obj, ns, name in found.reached:
        if ns is namespace and name in lent:
            continue
        if lent and (
            (isinstance(obj, type) and any(issubclass(obj, c) for c in ours)) or pool_bound(obj)
        ):
            label = name or getattr(obj, "__qualname__", repr(obj))
            return {}, f"reaches vLLM's {label} over a pool"
    return lent, ""
