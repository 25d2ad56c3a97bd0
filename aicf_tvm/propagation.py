"""The contract analysis: a fact per Relax value and per Emit call site of a function.

A worklist fixpoint over the Emit DAG of a function. Each value gets a fact (shape and
strides, numerics, ABI) and a set of buffers it may share storage with; facts start
from what Relax types prove and are refined through each Emit by the kind's transfer
rule (``aicf_tvm.kinds.transfer``). Alias facts per pair of ports follow from those
buffer sets: the same value MustAlias, disjoint fresh buffers NoAlias, a view and
its source MayAlias, two caller inputs Unknown. An Emit function called from several
sites keeps the join (the common guarantee) of its sites' facts
(``relax_passes.PropagateContracts`` stores it). With ``AICF_DEBUG=1`` it asserts
that every refinement descends (new ⊑ old), i.e. that the transfer rules are monotone.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax

from .contract import ContractFacts, PortFacts
from .emit import Emit, emit_of
from .kinds.describe import describe_call, is_tensor, output_types, split_call
from .kinds.registry import VIEW, rule_for
from .kinds.transfer import fresh_shape, transfer, value_facts
from .lattice import Alias, Alignment, NumericFact, ShapeFact

MUST, NO, MAY, UNKNOWN = (Alias(v) for v in ("MustAlias", "NoAlias", "MayAlias", "Unknown"))


def _returns_tensors(ty: Any) -> bool:
    if isinstance(ty, relax.TensorType):
        return True
    fields = getattr(ty, "fields", None)
    return bool(fields) and all(isinstance(f, relax.TensorType) for f in fields)


def debug_enabled() -> bool:
    return os.environ.get("AICF_DEBUG", "") not in ("", "0")


@dataclass(frozen=True)
class ValueFact:
    """What is known of one Relax value: its facts and the buffers it may share."""

    facts: PortFacts
    roots: frozenset  # ("param", i) | ("const", id) | ("value", var)

    @property
    def from_caller(self) -> bool:
        return any(r[0] == "param" for r in self.roots)


def alias_between(a: Any, b: Any, fa: ValueFact, fb: ValueFact) -> Alias:
    if a.same_as(b):
        return MUST
    if fa.roots & fb.roots:
        return MAY
    if fa.from_caller and fb.from_caller:
        return UNKNOWN
    return NO


@dataclass
class FactTable:
    """The result of the analysis: a fact per value, per-site contracts per Emit."""

    values: dict = field(default_factory=dict)  # relax.Var -> ValueFact | tuple[ValueFact]
    sites: dict = field(default_factory=dict)  # GlobalVar -> list[ContractFacts]

    def of(self, expr: Any) -> ValueFact:
        if isinstance(expr, relax.Var):
            return self.values[expr]
        return constant_fact(expr)


def constant_fact(expr: Any) -> ValueFact:
    ty = expr.ty
    if isinstance(ty, relax.TensorType):
        shape = fresh_shape(ty)
        return ValueFact(value_facts(shape, NumericFact.exact(str(ty.dtype))), frozenset({("const", id(expr))}))
    return ValueFact(PortFacts(), frozenset({("const", id(expr))}))


def _param_fact(i: int, param: relax.Var) -> ValueFact:
    ty = param.ty
    if not isinstance(ty, relax.TensorType):
        return ValueFact(PortFacts(), frozenset({("param", i)}))
    # The VM hands kernels compact tensors; their alignment is the caller's business.
    facts = value_facts(fresh_shape(ty), NumericFact.exact(str(ty.dtype)), Alignment.top())
    return ValueFact(facts, frozenset({("param", i)}))


def _cast_fact(src: Any, ty: Any) -> Any:
    """A ``match_cast``: the same storage, with the dims the cast checks at run time. A
    row-major source stays row-major over the new dims; other strides are not restated, so
    they become unknown."""
    if not isinstance(src, ValueFact) or not isinstance(ty, relax.TensorType):
        return src
    cast = fresh_shape(ty)
    if not src.facts.shape.is_contiguous():
        cast = ShapeFact.shape(cast.dims) if cast.dims is not None else cast
    facts = src.facts
    return ValueFact(value_facts(cast, facts.numeric, facts.abi.alignment), src.roots)


def _item_fact(var: relax.Var, src: ValueFact, index: int, fresh: frozenset) -> ValueFact:
    """An item of a tuple known only as a whole: an item of a caller's tuple is itself a
    caller input (Unknown alias with the others, not a fresh buffer)."""
    if not src.from_caller:
        return ValueFact(PortFacts(), fresh)
    roots = frozenset(r + (index,) for r in src.roots if r[0] == "param")
    if not isinstance(var.ty, relax.TensorType):
        return ValueFact(PortFacts(), roots)
    return ValueFact(_param_fact(0, var).facts, roots)


class _Analysis:
    def __init__(self, mod: tvm.IRModule, func: relax.Function) -> None:
        self.mod = mod
        self.func = func
        self.table = FactTable()
        self.emits: dict = {}  # GlobalVar -> (Emit, body call)
        self.transfers: dict = {}  # (callee, input fact ids) -> output facts
        self.site_cache: dict = {}  # (transfer key, alias values) -> ContractFacts
        self.keep: list = []
        self.debug = debug_enabled()

    def emit_info(self, gv: relax.GlobalVar) -> tuple[Emit, Any] | None:
        if gv not in self.emits:
            func = self.mod[gv] if gv in self.mod.get_global_vars() else None
            emit = emit_of(func) if isinstance(func, relax.Function) else None
            body = None
            if emit is not None:
                bindings = [b for blk in func.body.blocks for b in blk.bindings]
                if len(bindings) == 1 and isinstance(bindings[0].value, relax.Call):
                    body = bindings[0].value
            self.emits[gv] = None if emit is None else (emit, body)
        return self.emits[gv]

    def run(self) -> FactTable:
        values = self.table.values
        for i, p in enumerate(self.func.params):
            values[p] = _param_fact(i, p)
        bindings = [b for blk in self.func.body.blocks for b in blk.bindings]
        users: dict = {}
        for b in bindings:
            for v in relax.analysis.free_vars(b.value):
                users.setdefault(v, []).append(b)
        work = deque(bindings)
        queued = {id(b) for b in bindings}
        while work:
            b = work.popleft()
            queued.discard(id(b))
            new = self.visit(b)
            old = values.get(b.var)
            if old is not None and new == old:
                continue
            if self.debug and old is not None:
                _assert_descends(b.var, old, new)
            values[b.var] = new
            for u in users.get(b.var, ()):
                if id(u) not in queued:
                    work.append(u)
                    queued.add(id(u))
        return self.table

    def visit(self, binding: Any) -> Any:
        value, var = binding.value, binding.var
        fresh = frozenset({("value", var)})
        if isinstance(binding, relax.MatchCast) and isinstance(value, relax.Var):
            return _cast_fact(self.table.values[value], var.ty)
        if isinstance(value, relax.Var):
            return self.table.values[value]
        if isinstance(value, relax.TupleGetItem):
            src = self.table.of(value.tuple_value)
            return src[value.index] if isinstance(src, tuple) else _item_fact(var, src, value.index, fresh)
        if isinstance(value, relax.Tuple):
            return tuple(self.table.of(f) for f in value.fields)
        if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
            info = self.emit_info(value.op)
            if info is not None:
                return self.visit_emit(value, info, var)
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and _returns_tensors(var.ty):
            return self.visit_op(value, var)  # an op left in main (e.g. a view): its kind's rule
        if isinstance(var.ty, relax.TensorType):
            facts = value_facts(fresh_shape(var.ty), NumericFact.top())
            return ValueFact(facts, fresh)
        return ValueFact(PortFacts(), fresh)

    def visit_op(self, call: relax.Call, var: relax.Var) -> Any:
        sig = split_call(call)
        emit = describe_call(call, sig)
        ins = [self.table.of(a) for a in sig.tensor_args]
        ins = [f if not isinstance(f, tuple) else ValueFact(PortFacts(), frozenset()) for f in ins]
        outs = transfer(emit, call, [f.facts for f in ins], var.ty)
        roots = frozenset({("value", var)})
        if rule_for(emit.op).category == VIEW and ins:
            roots |= ins[0].roots
        facts = [ValueFact(o, roots) for o in outs]
        return facts[0] if len(facts) == 1 and isinstance(var.ty, relax.TensorType) else tuple(facts)

    def visit_emit(self, call: relax.Call, info: tuple, var: relax.Var) -> Any:
        emit, body = info
        args = list(call.args)
        ins = [self.table.of(a) for a in args]
        # Facts are interned (``value_facts``), so equal inputs are the same objects:
        # sites of one Emit with the same input facts share the transfer result.
        key = (call.op, tuple(id(f.facts) for f in ins))
        outs = self.transfers.get(key)
        if outs is None:
            outs = self.transfers[key] = transfer(emit, body, [f.facts for f in ins], var.ty)
            self.keep.append(ins)  # keeps the ids in the key alive
        is_view = rule_for(emit.op).category == VIEW
        roots = frozenset({("value", var)})
        if is_view and ins:
            roots |= ins[0].roots
        out_facts = [ValueFact(o, roots) for o in outs]
        self._record_site(call, emit, args, ins, out_facts, key)
        return out_facts[0] if len(out_facts) == 1 and not len(output_types(var.ty)) > 1 else tuple(out_facts)

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
        self.table.sites.setdefault(call.op, []).append(site)


def _with_effect(facts: PortFacts, template: PortFacts) -> PortFacts:
    return PortFacts(template.effect, facts.shape, facts.numeric, facts.abi)


def _assert_descends(var: Any, old: Any, new: Any) -> None:
    olds = old if isinstance(old, tuple) else (old,)
    news = new if isinstance(new, tuple) else (new,)
    for o, n in zip(olds, news):
        assert n.facts.leq(o.facts), f"non-monotone refinement of {var.name}: {o.facts} -> {n.facts}"


def analyze(mod: tvm.IRModule, name: str = "main") -> FactTable:
    """Facts of every value of function ``name`` and of every Emit call site in it."""
    return _Analysis(mod, mod[name]).run()
