"""The contract analysis: a fact per Relax value and per Emit call site of one function.

Facts (``aicf_tvm.core.facts``) start from what Relax types prove: parameters and constants
are fresh row-major buffers, a caller's alignment unknown. Each binding's fact comes
from its operands' through the kind's transfer rule (``aicf_tvm.core.kinds.transfer``); a
``match_cast`` keeps the value's storage with the dims the cast checks. Alias facts per
pair of ports follow from the buffers each value may hold (``alias_between``).

A single forward sweep, not a fixpoint: the bindings of a Relax function are in SSA
order, each operand bound before its use, and the function body has no back edges (a
branch of an ``If`` is not entered: its value gets the facts of its type). So one
visit per binding, in order, computes every fact from final facts, and no fact is ever
revised; there is nothing to iterate and no join within one function. The join happens
across call sites of one Emit (``relax_passes.PropagateContracts``).

The result is cached (``analysis_of``), as MLIR's analysis manager caches an analysis
until a pass changes the IR. TVM's IR is immutable: a pass that changes the function, or
an Emit function it calls, makes a new object, so the table is reused exactly while the
function and every Emit function the analysis looked up are the same objects as when it
ran (the cache holds them, so no other object can take their place, and TVM's
copy-on-write copies rather than edits an object held twice). Sound because the
analysis reads nothing else: the function's bindings and types, and per callee its Emit
and body. ``analyze`` computes the table afresh.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

import tvm
from tvm import relax

from .contract import ContractFacts, PortFacts
from .emit import Emit, emit_of
from .emit_graph import port_args
from .facts import (
    MAY,
    NO,
    Fact,
    FactTable,
    ParamRoot,
    TensorFact,
    TupleFact,
    ValueRoot,
    alias_between,
)
from .kinds.describe import describe_call, is_tensor, output_types, split_call
from .kinds.registry import VIEW, rule_for
from .kinds.transfer import fresh_shape, transfer, value_facts
from .lattice import Alignment, NumericFact, ShapeFact

# What a view op left in main reads from an operand whose fact is a tuple: nothing.
_UNTRACKED = TensorFact(PortFacts(), frozenset())


def _returns_tensors(ty: relax.Type) -> bool:
    if isinstance(ty, relax.TensorType):
        return True
    fields = getattr(ty, "fields", None)
    return bool(fields) and all(isinstance(f, relax.TensorType) for f in fields)


def _param_fact(i: int, param: relax.Var) -> TensorFact:
    ty = param.ty
    if not isinstance(ty, relax.TensorType):
        return TensorFact(PortFacts(), frozenset({ParamRoot(i)}))
    # The VM hands kernels compact tensors; their alignment is the caller's business.
    facts = value_facts(fresh_shape(ty), NumericFact.exact(str(ty.dtype)), Alignment.top())
    return TensorFact(facts, frozenset({ParamRoot(i)}))


def _cast_fact(src: Fact, ty: relax.Type) -> Fact:
    """A ``match_cast``: the same storage, with the dims the cast checks at run time. A
    row-major source stays row-major over the new dims; other strides are not restated, so
    they become unknown."""
    if not isinstance(src, TensorFact) or not isinstance(ty, relax.TensorType):
        return src
    cast = fresh_shape(ty)
    if not src.facts.shape.is_contiguous():
        cast = ShapeFact.shape(cast.dims) if cast.dims is not None else cast
    facts = src.facts
    return TensorFact(value_facts(cast, facts.numeric, facts.abi.alignment), src.roots)


def _item_fact(var: relax.Var, src: TensorFact, index: int, fresh: frozenset) -> TensorFact:
    """An item of a tuple known only as a whole: an item of a caller's tuple is itself a
    caller input (Unknown alias with the others, not a fresh buffer)."""
    if not src.from_caller:
        return TensorFact(PortFacts(), fresh)
    roots = frozenset(r.item(index) for r in src.roots if isinstance(r, ParamRoot))
    if not isinstance(var.ty, relax.TensorType):
        return TensorFact(PortFacts(), roots)
    return TensorFact(_param_fact(0, var).facts, roots)


class _Analysis:
    def __init__(self, mod: tvm.IRModule, func: relax.Function) -> None:
        self.mod = mod
        self.func = func
        self.values: dict[relax.Var, Fact] = {}
        self.sites: dict[relax.GlobalVar, list[ContractFacts]] = {}
        self.table = FactTable(self.values)  # what ``visit`` reads while the sweep runs
        self.funcs = dict(mod.functions_items())
        self.read: dict = {}  # GlobalVar -> the function it named (None: none), what the table depends on
        self.emits: dict = {}  # GlobalVar -> (Emit, body call)
        self.transfers: dict = {}  # (callee, input port facts) -> output facts
        self.site_cache: dict = {}  # (transfer key, alias values) -> ContractFacts

    def emit_info(self, gv: relax.GlobalVar) -> tuple[Emit, relax.Call | None] | None:
        if gv not in self.emits:
            func = self.read[gv] = self.funcs.get(gv)
            emit = emit_of(func) if isinstance(func, relax.Function) else None
            body = None
            if emit is not None:
                bindings = [b for blk in func.body.blocks for b in blk.bindings]
                if len(bindings) == 1 and isinstance(bindings[0].value, relax.Call):
                    body = bindings[0].value
            self.emits[gv] = None if emit is None else (emit, body)
        return self.emits[gv]

    def run(self) -> FactTable:
        """One visit per binding in program order (see the module docstring)."""
        values = self.values
        for i, p in enumerate(self.func.params):
            values[p] = _param_fact(i, p)
        for block in self.func.body.blocks:
            for binding in block.bindings:
                values[binding.var] = self.visit(binding)
        return FactTable.frozen(values, self.sites)

    def port_fact(self, call: relax.Call, arg: relax.Expr) -> TensorFact:
        """The fact of an Emit's port argument: one tensor (LiftEmits and FuseEmits pass
        tuples of tensors flattened), so a tuple fact here is a broken module."""
        fact = self.table.of(arg)
        if not isinstance(fact, TensorFact):
            raise TypeError(f"{call.op.name_hint}: a port argument has a tuple fact ({arg})")
        return fact

    def visit(self, binding: relax.Binding) -> Fact:
        value, var = binding.value, binding.var
        fresh = frozenset({ValueRoot(var)})
        if isinstance(binding, relax.MatchCast) and isinstance(value, relax.Var):
            return _cast_fact(self.values[value], var.ty)
        if isinstance(value, relax.Var):
            return self.values[value]
        if isinstance(value, relax.TupleGetItem):
            src = self.table.of(value.tuple_value)
            if isinstance(src, TupleFact):
                return src.fields[value.index]
            return _item_fact(var, src, value.index, fresh)
        if isinstance(value, relax.Tuple):
            return self.table.of(value)
        if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
            info = self.emit_info(value.op)
            if info is not None:
                return self.visit_emit(value, info, var)
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and _returns_tensors(var.ty):
            return self.visit_op(value, var)  # an op left in main (e.g. a view): its kind's rule
        if isinstance(var.ty, relax.TensorType):
            facts = value_facts(fresh_shape(var.ty), NumericFact.top())
            return TensorFact(facts, fresh)
        return TensorFact(PortFacts(), fresh)

    def visit_op(self, call: relax.Call, var: relax.Var) -> Fact:
        sig = split_call(call)
        emit = describe_call(call, sig)
        ins = [self.table.tensor(a) or _UNTRACKED for a in sig.tensor_args]
        outs = transfer(emit, call, [f.facts for f in ins], var.ty)
        roots = frozenset({ValueRoot(var)})
        if rule_for(emit.op).category == VIEW and ins:
            roots |= ins[0].roots
        facts = [TensorFact(o, roots) for o in outs]
        return facts[0] if len(facts) == 1 and isinstance(var.ty, relax.TensorType) else TupleFact(tuple(facts))

    def visit_emit(self, call: relax.Call, info: tuple, var: relax.Var) -> Fact:
        emit, body = info
        args = port_args(call)
        ins = [self.port_fact(call, a) for a in args]
        # Sites of one Emit with equal input facts share the transfer result (facts are
        # interned by ``value_facts`` and hash once, so the key is cheap).
        key = (call.op, tuple(f.facts for f in ins))
        outs = self.transfers.get(key)
        if outs is None:
            outs = self.transfers[key] = transfer(emit, body, [f.facts for f in ins], var.ty)
        is_view = rule_for(emit.op).category == VIEW
        roots = frozenset({ValueRoot(var)})
        if is_view and ins:
            roots |= ins[0].roots
        out_facts = [TensorFact(o, roots) for o in outs]
        self._record_site(call, emit, args, ins, out_facts, key)
        if len(out_facts) == 1 and not len(output_types(var.ty)) > 1:
            return out_facts[0]
        return TupleFact(tuple(out_facts))

    def _record_site(self, call, emit: Emit, args, ins, outs, key) -> None:
        names = [p.name for p in emit.interface.inputs]
        out_names = [p.name for p in emit.interface.outputs]
        alias = {}
        tensor_ins = [(n, a, f) for n, a, f in zip(names, args, ins) if is_tensor(a)]
        for i, (n1, a1, f1) in enumerate(tensor_ins):
            for n2, a2, f2 in tensor_ins[i + 1:]:
                alias[(n1, n2)] = alias_between(a1, a2, f1, f2)
            for name, f in zip(out_names, outs):
                alias[(n1, name)] = MAY if (f.roots & f1.roots) else NO
        site_key = (key, tuple(alias.values()))
        site = self.site_cache.get(site_key)
        if site is None:
            ports: dict[str, PortFacts] = {}
            template = emit.contract.provides
            for name, f in zip(names, ins):
                ports[name] = _with_effect(f.facts, template.port(name))
            for name, f in zip(out_names, outs):
                ports[name] = _with_effect(f.facts, template.port(name))
            site = self.site_cache[site_key] = ContractFacts.of(ports, alias)
        self.sites.setdefault(call.op, []).append(site)


def _with_effect(facts: PortFacts, template: PortFacts) -> PortFacts:
    return PortFacts(template.effect, facts.shape, facts.numeric, facts.abi)


def analyze(mod: tvm.IRModule, name: str = "main") -> FactTable:
    """Facts of every value of function ``name`` and of every Emit call site in it, computed now."""
    return _Analysis(mod, mod[name]).run()


class _Cached(NamedTuple):
    read: tuple[tuple[relax.GlobalVar, tvm.ir.BaseFunc | None], ...]  # each callee and the function it named
    table: FactTable


_CACHE: OrderedDict[relax.Function, _Cached] = OrderedDict()  # keys hash by reference
_CACHE_SIZE = 8  # the pipeline needs the latest; a few more serve modules compiled side by side
_LOCK = threading.Lock()


def _same(a: tvm.ir.Node | None, b: tvm.ir.Node | None) -> bool:
    return a is b or (a is not None and b is not None and a.same_as(b))


def analysis_of(mod: tvm.IRModule, name: str = "main") -> FactTable:
    """The facts of function ``name``, as ``analyze`` gives them, computed once and reused
    while the function and the Emit functions it calls are unchanged (module docstring)."""
    func = mod[name]
    with _LOCK:
        hit = _CACHE.get(func)
    if hit is not None:
        funcs = dict(mod.functions_items())
        if all(_same(funcs.get(gv), f) for gv, f in hit.read):
            return hit.table
    analysis = _Analysis(mod, func)
    table = analysis.run()
    with _LOCK:
        _CACHE[func] = _Cached(tuple(analysis.read.items()), table)
        _CACHE.move_to_end(func)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return table


def clear_analysis_cache() -> None:
    """Forget every cached table (tests; a long-lived process that wants the memory back)."""
    with _LOCK:
        _CACHE.clear()
