"""The Relax form of a group-wise int4 linear layer (``compile_causal_lm(weights="int4")``,
imported by ``from_torch``'s converter of ``aicf::linear_int4``):
``x [..., K]`` times the weight packed by ``schedules.cpu.linear_int4.pack_int4``, as a
``call_tir`` of that module's hand-scheduled kernel over ``x``'s rows: ``gemv_int4`` for
one row (the decode step), reading ``x`` in its own shape; ``linear_int4`` for any other
count (the prompt), with ``x`` reshaped to ``[rows, K]`` and the result back to ``[..., N]``.
The GEMV is built in its portable form here; ``schedules.cpu.linear_int4.for_target``
gives it the target's when the pipeline schedules.

With int8 activations (``aicf::linear_int4_q8``) one row calls ``gemv_int4_q8`` and any
other count ``linear_int4_q8``, both summing in integers; ``aicf::linear_int8_q8`` (int8
weights with int8 activations) calls the same kernels in their 8-bit form.

The call is an opaque Emit to our passes (a ``call_tir``): nothing fuses into it or moves
it, and the packed weight stays a constant of its own (constant folding leaves a call with
a non-constant ``x``).
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from schedules.cpu.linear_int4 import BLOCK, gemv_int4, gemv_int4_q8, linear_int4, linear_int4_q8


def linear_int4_call(bb: relax.BlockBuilder, x: relax.Expr, packed: relax.Expr, scales: relax.Expr,
                     int8_activations: bool = False, bits: int = 4) -> relax.Expr:
    """``x @ W.T`` for the int4 weight ``(packed, scales)``, ``x`` first rounded to int8
    per group with ``int8_activations`` (module docstring); ``bits=8``: the int8 weight of
    ``pack_int8``, with int8 activations."""
    shape = list(x.ty.shape)
    tasks, words, block = (int(d) for d in packed.ty.shape)
    n, k = tasks * block, words * 32 // bits
    if block != BLOCK or str(x.ty.dtype) != "float32" or not shape or not _is(shape[-1], k):
        raise ValueError(f"linear_int4: x {shape} {x.ty.dtype} does not fit a packed int4 weight "
                         f"{list(packed.ty.shape)}")
    scale = str(scales.ty.dtype)
    lead = (1,) * (len(shape) - 1)
    if all(_is(d, 1) for d in shape[:-1]):  # one row: the GEMV reads x as it is
        name = f"gemv_int{bits}_q8_{n}x{k}" if int8_activations else f"gemv_int4_{n}x{k}"
        kernel = gemv_int4_q8(n, k, name, scale, lead, vnni=bits == 8, bits=bits) if int8_activations \
            else gemv_int4(n, k, name, scale, lead=lead)
        gv = bb.add_func(kernel, name)
        return relax.call_tir(gv, [x, packed, scales], relax.TensorType([*shape[:-1], n], "float32"))
    rows = tirx.IntImm("int64", 1)
    for d in shape[:-1]:
        rows = rows * d
    rows = tvm.sym.Analyzer().simplify(rows)
    name = f"linear_int{bits}_q8_{n}x{k}" if int8_activations else f"linear_int4_{n}x{k}"
    kernel = linear_int4_q8(n, k, name, scale, vnni=bits == 8, bits=bits) if int8_activations \
        else linear_int4(n, k, name, scale)
    gv = bb.add_func(kernel, name)
    flat = bb.emit(relax.op.reshape(x, [rows, k]))
    y = bb.emit(relax.call_tir(gv, [flat, packed, scales], relax.TensorType([rows, n], "float32")))
    return relax.op.reshape(y, [*shape[:-1], n])


def _is(dim: tirx.Expr, value: int) -> bool:
    return isinstance(dim, tirx.IntImm) and dim.value == value


__all__ = ["linear_int4_call"]
