"""LiftAdamSteps: lift each parameter's Adam update into one ``adam_step`` Emit.

Recognizes, in the dataflow blocks of the public functions, the per-parameter update

    g' = wd * p + g                          (only when weight decay is on)
    m' = β1 * m + (1 - β1) * g'
    v' = β2 * v + (1 - β2) * (g' * g')
    p' = p - lr * ((m' / bias1) / (sqrt(v' / bias2) + eps))

(``bias_i = 1 - β_i^t`` as rank-0 tensors; add/multiply operands in any order; ``lr * a / b``
also as ``(lr * a) / b``) — what ``relax.training.optimizer.Adam(...).get_function()``
emits and what one writes by hand — and replaces it by ``t = adam_step(p, g, m, v, bias1,
bias2)`` with ``p', m', v'`` read from ``t`` (``aicf_tvm.core.kinds.adam``). When the
function carries ``aicf.distinct_inputs``, the Emit asserts NoAlias for each pair of its
ports bound to two different caller inputs.

Runs before LiftEmits, on op-level Relax. Sound: the Emit function's body is the same
formula; a match whose intermediate values are used elsewhere, or whose ``m'``/``v'`` is
used before ``p'``, is left alone. Idempotent: lifted calls are no longer op calls.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax import dpl

from aicf_tvm.core.contract import ContractFacts
from aicf_tvm.core.emit import exact_key
from aicf_tvm.core.kinds.adam import (
    ADAM_PORTS,
    ATTRS,
    DISTINCT_INPUTS_ATTR,
    WRITTEN,
    adam_step_emit,
    adam_step_function,
)
from aicf_tvm.core.lattice import NO_ALIAS

_ROLES = ("param", "grad", "m", "v", "bias1", "bias2") + ATTRS + ("m_new", "v_new")


def adam_patterns() -> list[dict[str, dpl.DFPattern]]:
    """Pattern variants (weight decay or not, ``lr * a / b`` either way), root under "root"."""
    out = []
    for decay in (True, False):
        for lr_inside in (True, False):
            r = {n: dpl.wildcard() for n in ADAM_PORTS} | {n: dpl.is_const() for n in ATTRS}
            add, mul, div = (dpl.is_op(f"relax.{o}") for o in ("add", "multiply", "divide"))
            g = add(mul(r["weight_decay"], r["param"]), r["grad"]) if decay else r["grad"]
            r["m_new"] = add(mul(r["beta1"], r["m"]), mul(r["one_minus_beta1"], g))
            r["v_new"] = add(mul(r["beta2"], r["v"]), mul(r["one_minus_beta2"], mul(g, g)))
            m_hat, v_hat = div(r["m_new"], r["bias1"]), div(r["v_new"], r["bias2"])
            denom = add(dpl.is_op("relax.sqrt")(v_hat), r["eps"])
            upd = mul(r["lr"], div(m_hat, denom)) if lr_inside else div(mul(r["lr"], m_hat), denom)
            r["root"] = dpl.is_op("relax.subtract")(r["param"], upd)
            if not decay:
                del r["weight_decay"]
            out.append(r)
    return out


def scalar(const: tvm.ir.Constant) -> float | None:
    """The value of a rank-0 (or one-element) floating constant, else None."""
    data = const.value.numpy()
    if data.size != 1 or data.dtype.kind != "f":
        return None
    return float(data.reshape(()))


def adam_attrs(got: dict[str, relax.Expr]) -> dict[str, float] | None:
    """Attrs of a match, or None when its constants are not an Adam step's."""
    vals = {k: scalar(got[k]) if k in got else 0.0 for k in ATTRS}
    if any(v is None for v in vals.values()):
        return None
    for b in ("beta1", "beta2"):  # the complement must be 1 - β (to float32 precision)
        if abs(vals[f"one_minus_{b}"] - (1.0 - vals[b])) > 1e-6:
            return None
    return vals


def caller_paths(func: relax.Function) -> dict[relax.Var, tuple[int, ...]]:
    """Each var bound to a caller input: param index, then tuple indices (``params[0]`` -> (0, 0))."""
    paths: dict[relax.Var, tuple[int, ...]] = {p: (i,) for i, p in enumerate(func.params)}
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.TupleGetItem) and v.tuple_value in paths:
                paths[b.var] = paths[v.tuple_value] + (v.index,)
            elif isinstance(v, relax.Var) and v in paths:
                paths[b.var] = paths[v]
    return paths


def asserted_facts(args: list[relax.Expr], paths: dict) -> ContractFacts:
    """NoAlias for each pair of written/read tensor ports bound to different caller inputs."""
    alias = {}
    names = ADAM_PORTS[:4]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pa, pb = paths.get(args[i]), paths.get(args[names.index(b)])
            if pa is not None and pb is not None and pa != pb and (a in WRITTEN or b in WRITTEN):
                alias[(a, b)] = NO_ALIAS
    return ContractFacts.of(alias=alias)


class _BlockLifter:
    def __init__(self, bb: relax.BlockBuilder, func: relax.Function, cache: dict) -> None:
        self.bb, self.cache = bb, cache
        self.paths = caller_paths(func) if func.attrs is not None and DISTINCT_INPUTS_ATTR in func.attrs else {}
        self.uses: dict[relax.Var, list[int]] = {}  # var -> binding positions using it (-1: after the block)
        self.patterns = adam_patterns()

    def lift(self, block: relax.DataflowBlock, later: relax.Expr) -> relax.DataflowBlock | None:
        bindings = list(block.bindings)
        var2val = {b.var: b.value for b in bindings}
        val2pos = {b.value: i for i, b in enumerate(bindings)}
        self.uses = {}
        for i, b in enumerate(bindings):
            for v in relax.analysis.free_vars(b.value):
                self.uses.setdefault(v, []).append(i)
        for v in relax.analysis.free_vars(later):
            self.uses.setdefault(v, []).append(len(bindings))
        replaced: dict[int, list] = {}
        dropped: set[int] = set()
        for pos, b in enumerate(bindings):
            if not (isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
                    and b.value.op.name == "relax.subtract"):
                continue
            for pattern in self.patterns:
                got = pattern["root"].extract_matched_expr(b.value, var2val)
                found = self._lifted(pos, pattern, got, bindings, val2pos, dropped) if got else None
                if found is not None:
                    members, new = found
                    dropped |= members
                    replaced[pos] = new
                    break
        if not replaced:
            return None
        out = []
        for pos, b in enumerate(bindings):
            if pos in replaced:
                out.extend(replaced[pos])
            elif pos not in dropped:
                out.append(b)
        return relax.DataflowBlock(out)

    def _lifted(self, pos, pattern, got, bindings, val2pos, dropped) -> tuple[set[int], list] | None:
        roles = {r: got.get(p) for r, p in pattern.items() if p in got}
        attrs = adam_attrs(roles)
        if attrs is None:
            return None
        members = {val2pos[e] for p, e in got.items() if not isinstance(p, (dpl.WildcardPattern, dpl.ConstantPattern))
                   and e in val2pos}
        keep = {val2pos[roles["m_new"]], val2pos[roles["v_new"]], pos}
        if members & dropped or any(u not in members for i in members - keep
                                    for u in self.uses.get(bindings[i].var, [])):
            return None  # an intermediate value is needed elsewhere
        if any(u < pos and u not in members for i in keep for u in self.uses.get(bindings[i].var, [])):
            return None  # m' or v' is read before p' is computed
        args = [self._var_of(roles[n], bindings, val2pos) for n in ADAM_PORTS]
        p_ty, s_ty = args[0].ty, args[4].ty
        if not (isinstance(p_ty, relax.TensorType) and isinstance(s_ty, relax.TensorType) and s_ty.ndim == 0):
            return None
        if any(not tvm_ffi.structural_equal(a.ty, p_ty) for a in args[1:4]) or args[5].ty.ndim != 0:
            return None
        gv = self._function(p_ty, s_ty, attrs, asserted_facts(args, self.paths))
        tup = relax.DataflowVar("adam_out", relax.TupleType([p_ty, p_ty, p_ty]))
        new = [relax.VarBinding(tup, relax.Call(gv, args))]
        for j, i in enumerate((pos, val2pos[roles["m_new"]], val2pos[roles["v_new"]])):
            new.append(relax.VarBinding(bindings[i].var, relax.TupleGetItem(tup, j)))
        return members, new

    def _var_of(self, expr: relax.Expr, bindings, val2pos) -> relax.Expr:
        return bindings[val2pos[expr]].var if expr in val2pos else expr

    def _function(self, p_ty, s_ty, attrs, asserted: ContractFacts) -> relax.GlobalVar:
        attrs_key = exact_key(tuple(sorted(attrs.items())))  # lr 0.0 and -0.0 are two steps
        key = (tvm_ffi.structural_hash(p_ty), tvm_ffi.structural_hash(s_ty), attrs_key, asserted)
        if key not in self.cache:
            emit = adam_step_emit(p_ty, s_ty, attrs, asserted)
            self.cache[key] = self.bb.add_func(adam_step_function(p_ty, s_ty, attrs, emit), "adam_step")
        return self.cache[key]


@tvm.transform.module_pass(opt_level=0, name="LiftAdamSteps")
class LiftAdamSteps:
    """Lift every per-parameter Adam update of the public Relax functions to ``adam_step``."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        bb = relax.BlockBuilder(mod)
        cache: dict = {}
        changed = False
        for gv, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or func.attrs is None or "global_symbol" not in func.attrs:
                continue
            lifter = _BlockLifter(bb, func, cache)
            blocks = list(func.body.blocks)
            for k, block in enumerate(blocks):
                if isinstance(block, relax.DataflowBlock):
                    later = relax.SeqExpr(blocks[k + 1:], func.body.body)
                    new = lifter.lift(block, later)
                    if new is not None:
                        blocks[k], changed = new, True
            if blocks != list(func.body.blocks):
                body = relax.SeqExpr(blocks, func.body.body)
                bb.update_func(gv, bb.normalize(relax.Function(func.params, body, func.ret_ty, func.is_pure,
                                                               func.attrs)))
        return bb.get() if changed else mod
