"""CPU rule for the min or max of a whole tensor into a scalar (the range that
ONNX's DynamicQuantizeLinear computes of each activation), vectorized with the serial
loop's exact result.

TVM's ``T.min(acc, x)`` is ``select(acc < x, acc, x)`` (``T.max`` with ``>``): NaN and
signed zeros make the serial loop order-dependent. Without a NaN, each step keeps the
running extreme and an element equal to it replaces it, so the loop ends on the *last*
element equal to the extreme (``T.min(x, acc)``: the first), or on the initial value
when no element reaches it. Equal floats other than zeros have equal bits, so:

1. one vectorized pass (16 lanes on AVX-512, 8 on AVX2) finds the extreme ``m`` and
   whether any element is NaN (the largest ``bits & 0x7fffffff`` above inf's);
2. no NaN and ``m`` not zero: the result is ``m``;
3. no NaN and ``m`` zero: a second vectorized pass finds the last (first) zero, and the
   result is that element, with its sign (or the initial value when there is none);
4. a NaN anywhere: the original serial loop, whose result (a NaN ends the loop's memory
   of what came before) the vector passes would not reproduce.

So every input gives the serial loop's bits. The rule takes a PrimFunc of a reduction
block over every element of one contiguous input (identity indices, all axes reduced,
the last a multiple of the vector width) into a 0-d buffer, with its init a constant,
and scalar blocks after it (DynamicQuantizeLinear's ``min(0, .)`` and its scale); it
replaces the reduction's loop nest by the passes above, writing the same buffer, and
leaves the rest of the function as it is.
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.script import tirx as T
from tvm.target import Target

from .common import float32_lanes, is_one, nodes_in

UNROLL = 8  # vectors of x per step of the main pass
ABS_BITS = 0x7FFFFFFF  # a float32's bits without its sign
INF_BITS = 0x7F800000  # those of inf; a NaN's are above


def _blocks(func: tirx.PrimFunc) -> list[s_tir.SBlock]:
    return [b for b in nodes_in(func.body, s_tir.SBlock) if b.name_hint != "root"]


def _match(func: tirx.PrimFunc, lanes: int):
    """(input, reduction buffer, input shape, "min"/"max", acc first, init value, the
    reduction's outermost loop) of a PrimFunc the rule takes, else None."""
    blocks = _blocks(func)
    if len(blocks) < 2:
        return None
    red, epilogues = blocks[0], blocks[1:]
    if not red.iter_vars or any(iv.iter_type != tirx.IterVar.CommReduce for iv in red.iter_vars):
        return None
    for block in epilogues:  # scalar steps after the reduction (DynamicQuantizeLinear's scale)
        if any(iv.iter_type == tirx.IterVar.CommReduce or not is_one(iv.dom.extent) for iv in block.iter_vars):
            return None
    store, init = red.body, red.init
    if not (isinstance(store, tirx.BufferStore) and isinstance(init, tirx.BufferStore)
            and len(store.buffer.shape) == 0 and init.buffer.same_as(store.buffer)
            and isinstance(init.value, tirx.FloatImm) and str(store.value.ty) == "float32"):
        return None
    value = store.value
    kind = "min" if isinstance(value, tirx.Min) else "max" if isinstance(value, tirx.Max) else None
    if kind is None:
        return None
    a, b = value.a, value.b
    acc_first = isinstance(a, ir.TensorLoad) and a.source.same_as(store.buffer)
    acc, x = (a, b) if acc_first else (b, a)
    if not (isinstance(acc, ir.TensorLoad) and acc.source.same_as(store.buffer) and isinstance(x, ir.TensorLoad)):
        return None
    buf = x.source
    if list(getattr(buf, "strides", None) or []):  # read as one dense row below
        return None
    shape = [d.value if isinstance(d, tirx.IntImm) else None for d in buf.shape]
    if None in shape or not shape or shape[-1] % lanes or len(x.indices) != len(red.iter_vars):
        return None
    if any(not idx.same_as(iv.var) or not isinstance(iv.dom.extent, tirx.IntImm) or iv.dom.extent.value != dim
           for idx, iv, dim in zip(x.indices, red.iter_vars, shape)):
        return None
    loops: list[tirx.For] = []
    tvm_ffi.structural_walk(func.body, [(tirx.For, loops.append)])
    nest = [loop for loop in loops if _contains(loop, red)]
    if not nest:
        return None
    outer = max(nest, key=_depth)  # the outermost loop of the reduction's nest
    if sum(_contains(outer, b) for b in blocks) != 1:  # the nest holds the reduction alone
        return None
    return buf, store.buffer, shape, kind, acc_first, float(init.value.value), outer


def _depth(loop: tirx.For) -> int:
    """Loops nested in ``loop``, itself included."""
    found: list[tirx.For] = []
    tvm_ffi.structural_walk(loop, [(tirx.For, found.append)])
    return len(found)


def _contains(loop: tirx.For, block: s_tir.SBlock) -> bool:
    found: list[bool] = []
    tvm_ffi.structural_walk(loop.body, [(s_tir.SBlock, lambda b: found.append(b.same_as(block)))])
    return any(found)


def _tree(op, values: list) -> tirx.Expr:
    """``op`` over ``values`` as a balanced tree (independent operations)."""
    while len(values) > 1:
        values = [op(values[i], values[i + 1]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def _reduction(x_in, r, shape: list[int], kind: str, acc_first: bool, init: float, lanes: int) -> tirx.Stmt:
    """The statement ``r[()] = `` the serial loop's result over ``x_in`` (module
    docstring), on the matched function's own buffers."""
    n = 1
    for d in shape:
        n *= d
    vectors = n // lanes
    extreme = T.min if kind == "min" else T.max  # select(x < e, x, e): the value, ties aside
    step = (lambda acc, v: extreme(acc, v)) if acc_first else (lambda acc, v: extreme(v, acc))
    pick = T.max if acc_first else T.min
    none = -1 if acc_first else n

    @T.prim_func(s_tir=True, check_well_formed=False)  # x_in and r belong to the matched function
    def holder():
        with T.sblock("root"):
            x = T.decl_buffer((n,), "float32", data=x_in.data)
            ext = T.decl_buffer((lanes,), "float32", scope="local")
            bits = T.decl_buffer((lanes,), "int32", scope="local")
            at = T.decl_buffer((lanes,), "int32", scope="local")
            m = T.decl_buffer((1,), "float32", scope="local")
            top = T.decl_buffer((1,), "int32", scope="local")
            last = T.decl_buffer((1,), "int32", scope="local")
            for j in T.vectorized(lanes):
                ext[j] = T.float32(init)
                bits[j] = 0
            # UNROLL vectors a step, combined in registers before they meet the running
            # extreme (which the code keeps in memory: a chain through memory per vector)
            for i in T.serial(vectors // UNROLL):
                for j in T.vectorized(lanes):
                    ext[j] = extreme(_tree(extreme, [x[(i * UNROLL + u) * lanes + j] for u in range(UNROLL)]), ext[j])
                    # the largest |x| as bits: above those of inf only for a NaN
                    bits[j] = T.max(_tree(T.max, [T.bitwise_and(T.reinterpret("int32", x[(i * UNROLL + u) * lanes + j]),
                                                                ABS_BITS) for u in range(UNROLL)]), bits[j])
            for i in T.serial(vectors // UNROLL * UNROLL, vectors):
                for j in T.vectorized(lanes):
                    ext[j] = extreme(x[i * lanes + j], ext[j])
                    bits[j] = T.max(T.bitwise_and(T.reinterpret("int32", x[i * lanes + j]), ABS_BITS), bits[j])
            m[0] = ext[0]
            top[0] = bits[0]
            for j in T.unroll(1, lanes):
                m[0] = extreme(ext[j], m[0])
                top[0] = T.max(top[0], bits[j])
            if top[0] > INF_BITS:  # a NaN: the serial loop itself
                r[()] = T.float32(init)
                for i in T.serial(n):
                    r[()] = step(r[()], x[i])
            elif m[0] != T.float32(0):
                r[()] = m[0]
            else:  # the last (first) zero, with its sign
                for j in T.vectorized(lanes):
                    at[j] = none
                for i in T.serial(vectors):
                    for j in T.vectorized(lanes):
                        at[j] = pick(at[j], T.Select(x[i * lanes + j] == T.float32(0), i * lanes + j, none))
                last[0] = at[0]
                for j in T.unroll(1, lanes):
                    last[0] = pick(last[0], at[j])
                if last[0] == none:
                    r[()] = T.float32(init)
                else:
                    r[()] = x[last[0]]

    return holder.body.block.body


class FullMinMax(CPUScheduleRule):
    """The min/max of a whole tensor into a scalar, vectorized, the serial loop's bits
    (module docstring)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target) \
                or target.kind.name != "llvm":
            return None
        lanes = max(float32_lanes(target), 4)
        matched = _match(func, lanes)
        if matched is None:
            return None
        buf, red, shape, kind, acc_first, init, outer = matched
        stmt = _reduction(buf, red, shape, kind, acc_first, init, lanes)
        return s_tir.Schedule(tvm_ffi.structural_map(func, [(tirx.For, lambda loop: stmt if loop.same_as(outer)
                                                                else loop)]))


__all__ = ["FullMinMax"]
