"""Kernels of a linear layer whose weight is stored as group-wise int4
(``compile_causal_lm(weights="int4")``, ``aicf_tvm.driver.quantize_weights``).

The weight ``W [N, K]`` is ``v * scale`` with ``v`` a signed 4-bit integer in ``[-8, 7]``
and one scale per group of ``GROUP`` consecutive inputs of an output row. Stored, it is
two arrays in the kernels' order (``pack_int4``)::

    packed [N / BLOCK, K / 8, BLOCK] int32    word (t, c, j): v[t*BLOCK + j, 8c + i] in bits
                                              4i .. 4i + 3 (two's complement), i = 0 .. 7
    scales [N / BLOCK, K / GROUP, BLOCK] f16  scale of (t*BLOCK + j, group g)

so one vector load brings 8 weights of each of 16 (AVX-512) consecutive outputs, one per
32-bit lane. Half a byte per weight plus 1/16 of one for the scales: ~0.14 of the
float32 bytes a decode step reads. The scales are float16 when every one of them is a
normal float16 (``pack_int4`` keeps float32 otherwise; the kernels read either).

``gemv_int4`` (one row: the decode step): each task owns ``BLOCK`` outputs, whose sums
stay in registers over the whole ``K``; per group it sums ``x[k] * v`` in two chains
(even and odd ``i``), then adds the group's sum times its scale::

    y[n] = sum_g scale[n, g] * sum_{k in g} x[k] * v[n, k]

Each lane's value is its 4 bits at the top of the int32, shifted back down with the sign
(``(word << (28 - 4i)) >> 28``) and converted; on AVX-512 (``gemv_int4(lut=True)``) the
float is looked up instead: ``vpermps`` picks it from the 16 values ``[0 .. 7, -8 .. -1]`` by the
low 4 bits of ``word >> 4i``, one shift and one lookup per 16 weights.

``linear_int4`` (any number of rows: the prompt): per group, the ``[GROUP, BLOCK]`` tile of
the weight is dequantized once into a stack buffer (``v * scale``, as the PyTorch layer
computes it) and every row adds its products with it into its outputs: the rows share
each dequantized tile.

``gemv_int4_q8`` and ``linear_int4_q8`` (``compile_causal_lm(weights="int4",
activations="int8")``, an opt-in approximation on top of the weights'): the layer's input
is first rounded to int8 per group of ``GROUP`` inputs, ``q = round(x / s)`` (half to
even) with ``s = max|x| / 127`` over the group (1 where the group is all zeros), and the
layer computes ``linear(q * s, W)``. Both round their rows into a workspace, then sum in
integers: per group ``sum_k q[k] * v[n, k]`` exactly, on the weights offset to ``v + 8``
in ``[0, 15]`` (unsigned bytes) and the row's signed bytes, less ``8 * sum_k q[k]``; then
``y[n] += float(that) * (scale[n, g] * s_g)``. On AVX2 (8 lanes, ``has_q8``) from
``vpmaddubsw`` (adjacent pairs of products summed into int16), four words of eight
weights added in int16 (at most ``16 * 15 * 127 = 30480``: no saturation, no wrap), and
``vpmaddwd`` by ones into int32; with AVX-512 VNNI (16 lanes, ``has_vnni``) ``vpdpbusd``
adds four products into each int32 lane at once, its sums starting from
``-8 * sum_k q[k]``. Four to five times fewer instructions per weight than widening each
nibble to a float (the GEMV), three times fewer than the float multiply-adds
(``linear_int4_q8``, whose rows share each group's weight bytes from a stack tile). A
group holding a NaN or an infinity gets a NaN scale (every output NaN, as the float
layer's would be).

The same two kernels take per-channel int8 weights with int8 activations (``bits=8``,
``compile_causal_lm(weights="int8", activations="int8")``; VNNI only): ``pack_int8``
stores 4 weights a word (``packed [N / BLOCK, K / 4, BLOCK]``, the scales ``[N / BLOCK,
1, BLOCK]``), each word offset by 0x80808080 to unsigned bytes ``q_w + 128``, the row's
bytes in order, the sums from ``-128 * sum_k q[k]``. AVX2 has no such form:
``vpmaddubsw`` would saturate on ``2 * 255 * 127``.

Each is the dot product of ``x`` with the dequantized row up to the order of the
additions (and, in ``gemv_int4``, where the scale is applied), as in any GEMM. The
multiply-adds are fused (``fma``): a matrix product states no rounding per product
(docs/numerics.md). Written and scheduled by hand (``tirx.is_scheduled``): every index is
in bounds by construction, since ``K`` is a whole number of groups and ``N`` of blocks
(``fits_int4``).
"""

from __future__ import annotations

import numpy as np
from tvm import IRModule, tirx
from tvm.script import tirx as T
from tvm.target import Target
from tvm.tirx.op import fma

from aicf_tvm.core.emit import PLAN_ATTR

from .common import _has_feature, float32_lanes, vector_registers
from .conv2d_int8 import has_vnni, pmaddubsw, pmaddwd_ones

GROUP = 32  # inputs per scale
BLOCK = 64  # outputs per task
NIBBLES = 8  # weights per int32 word
INT4_GEMV_ATTR = "aicf.int4_gemv"  # "N K rank-of-x scale-dtype lookup-form lanes pass-vectors"
INT4_LINEAR_ATTR = "aicf.int4_linear"  # "N K scale-dtype rows columns row-block"
LUT_LANES = 16  # AVX-512: vpermps picks from 16 floats by the low 4 bits of each index
ROW_BLOCK = 64  # rows whose sums a task keeps in a buffer of its own (linear_int4)
QUAD = 4  # rows whose sums stay in registers over a group (linear_int4)
FLOAT16_MIN, FLOAT16_MAX = 2.0 ** -14, 65504.0  # normal float16
INT4_GEMV_Q8_ATTR = "aicf.int4_gemv_q8"  # "N K rank-of-x scale-dtype pass-vectors vnni weight-bits"
INT4_LINEAR_Q8_ATTR = "aicf.int4_linear_q8"  # "N K scale-dtype rows vectors row-block vnni weight-bits"
Q8_ROWS = 2  # rows of linear_int4_q8's register tile (int4_form)
Q8_MAX = 127  # int8 activations: round(x / s) in [-127, 127], s = max|x| / 127 of the group
Q8_LANES = 8  # int32 lanes of the AVX2 form
Q8_VNNI_LANES = 16  # int32 lanes of the AVX-512 VNNI form
HALVES = GROUP // 4  # the q8 kernels' steps through a group: 4 inputs (one int32 of the row's bytes) each
_OFFSET = -2004318072  # 0x88888888: each two's complement nibble v to v + 8, in [0, 15]
_OFFSET8 = -2139062144  # 0x80808080: each int8 v to v + 128, in [1, 255]
_LOW_NIBBLES = 0x0F0F0F0F
_EXPONENT = 0x7F800000  # float32's exponent bits


def fits_int4(n: int, k: int) -> bool:
    """Whether a ``[N, K]`` weight has the kernels' shape: whole groups and blocks."""
    return n % BLOCK == 0 and k % GROUP == 0 and n > 0 and k > 0


def scale_dtype(scale: np.ndarray) -> str:
    """float16 when every scale is a normal float16 number, else float32."""
    magnitude = np.abs(scale)
    normal = magnitude.size and magnitude.min() >= FLOAT16_MIN and magnitude.max() <= FLOAT16_MAX
    return "float16" if normal else "float32"


def pack_int4(v: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``v [N, K]`` (integers in [-8, 7]) and ``scale [N, K / GROUP]`` (already of
    ``scale_dtype``) in the kernels' layout (module docstring)."""
    n, k = v.shape
    if not fits_int4(n, k) or scale.shape != (n, k // GROUP):
        raise ValueError(f"int4 weight [{n}, {k}] with scales {scale.shape}: need N % {BLOCK} == 0, "
                         f"K % {GROUP} == 0 and [N, K / {GROUP}] scales")
    nibbles = (v.astype(np.int64) & 15).reshape(n, k // NIBBLES, NIBBLES)
    words = np.zeros((n, k // NIBBLES), np.uint32)
    for i in range(NIBBLES):
        words |= (nibbles[:, :, i] << (4 * i)).astype(np.uint32)
    packed = np.ascontiguousarray(words.view(np.int32).reshape(n // BLOCK, BLOCK, k // NIBBLES).transpose(0, 2, 1))
    scales = np.ascontiguousarray(scale.reshape(n // BLOCK, BLOCK, k // GROUP).transpose(0, 2, 1))
    return packed, scales


def pack_int8(q: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``q [N, K]`` (int8 in [-127, 127]) and its per-output ``scale [N]`` in the int8 q8
    kernels' layout: ``packed [N / BLOCK, K / 4, BLOCK]`` int32 whose word ``(t, c, j)``
    holds ``q[t*BLOCK + j, 4c + b]`` in byte ``b``; ``scales [N / BLOCK, 1, BLOCK]`` float32."""
    n, k = q.shape
    if not fits_int4(n, k) or scale.shape != (n,):
        raise ValueError(f"int8 weight [{n}, {k}] with scales {scale.shape}: need N % {BLOCK} == 0, "
                         f"K % {GROUP} == 0 and [N] scales")
    words = np.ascontiguousarray(q.astype(np.int8)).view(np.int32)  # [N, K / 4], little-endian bytes
    packed = np.ascontiguousarray(words.reshape(n // BLOCK, BLOCK, k // 4).transpose(0, 2, 1))
    return packed, np.ascontiguousarray(scale.astype(np.float32).reshape(n // BLOCK, 1, BLOCK))


def _named(kernel: tirx.PrimFunc, name: str, form_attr: str, form: str, plan: str) -> tirx.PrimFunc:
    """``kernel`` as ``name``, with its form (what ``for_target`` rebuilds from) and, for
    ``aicf explain``'s kernel table, its schedule (written by hand) and plan."""
    return (kernel.with_attr("global_symbol", name).with_attr(form_attr, form)
            .with_attr("aicf.schedule", "hand-written").with_attr(PLAN_ATTR, plan))


def _q8_plan(bits: int, vnni: bool, lanes: int) -> str:
    how = "vpdpbusd into int32" if vnni else "vpmaddubsw into int16 pairs, vpmaddwd"
    return f"int{bits} weights, int8 activations: {how}, {lanes} lanes"


def _int32(value, lanes: int) -> tirx.Expr:
    value = tirx.Cast("int32", value) if isinstance(value, tirx.Expr) else tirx.const(value, "int32")
    return tirx.Broadcast(value, lanes) if lanes > 1 else value


def _signed_nibble(word: tirx.Expr, i, lanes: int) -> tirx.Expr:
    """``float(v)`` of bits 4i .. 4i + 3 of ``word`` (``lanes`` int32 lanes): the 4 bits
    shifted to the top, then back down with the sign."""
    top = tirx.shift_left(word, _int32(28 - 4 * i, lanes))
    return tirx.Cast(f"float32x{lanes}" if lanes > 1 else "float32", tirx.shift_right(top, _int32(28, lanes)))


def _lookup(word: tirx.Expr, i, lanes: int = LUT_LANES) -> tirx.Expr:
    """``float(v)`` of bits 4i .. 4i + 3 of each of the 16 int32 lanes of ``word``: one
    ``vpermps`` from the table ``[0 .. 7, -8 .. -1]`` by the low 4 bits of ``word >> 4i``."""
    table = tirx.Cast(f"float32x{lanes}", tirx.bitwise_xor(tirx.Ramp(0, 1, lanes), tirx.Broadcast(8, lanes))
                      - tirx.Broadcast(8, lanes))
    index = tirx.shift_right(word, _int32(4 * i, lanes))
    return tirx.call_llvm_pure_intrin(f"float32x{lanes}", "llvm.x86.avx512.permvar.sf.512", table, index)


def gemv_int4(n: int, k: int, name: str = "gemv_int4", scale: str = "float16", lut: bool = False,
              lead: tuple[int, ...] = (1,), lanes: int = LUT_LANES, pass_vectors: int | None = None) -> tirx.PrimFunc:
    """``y [*lead, N] = x [*lead, K] @ W.T`` for one row (``lead`` all ones; module
    docstring); ``lut``: the AVX-512 form (``_lookup``), else every lane's value shifted
    and converted (any vector ISA). ``lanes`` float32 lanes a vector; a task's ``BLOCK``
    outputs are summed ``pass_vectors`` vectors at a time (all at once by default), each
    pass over the whole ``K``, so that its sums (3 x ``pass_vectors`` vectors) stay in
    registers (``int4_form``). The kernel records what it is (``INT4_GEMV_ATTR``), so
    ``for_target`` can rebuild it for the target."""
    if any(d != 1 for d in lead):
        raise ValueError(f"gemv_int4: one row, not {lead}")
    if lut and lanes != LUT_LANES:
        raise ValueError(f"gemv_int4: the lookup form has {LUT_LANES} lanes, not {lanes}")
    tasks, groups, chunks = n // BLOCK, k // GROUP, GROUP // NIBBLES
    vectors = BLOCK // lanes
    pv = vectors if pass_vectors is None else pass_vectors
    if BLOCK % lanes or vectors % pv:
        raise ValueError(f"gemv_int4: {BLOCK} outputs a task are not whole passes of {pv} x {lanes} lanes")
    width = pv * lanes  # outputs of one pass
    value = _lookup if lut else _signed_nibble

    @T.prim_func
    def kernel(x_in: T.Buffer((*lead, k), "float32"), packed: T.Buffer((tasks, k // NIBBLES, BLOCK), "int32"),
               scales: T.Buffer((tasks, groups, BLOCK), scale), y_out: T.Buffer((*lead, n), "float32")):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "aicf.kind": "linear_int4"})
        x = T.decl_buffer((1, k), "float32", data=x_in.data)
        y = T.decl_buffer((1, n), "float32", data=y_out.data)
        for t in T.parallel(tasks):
            for p in T.serial(vectors // pv):
                acc = T.decl_buffer((width,), "float32", scope="local")
                part = T.decl_buffer((2, width), "float32", scope="local")
                for v in T.unroll(pv):
                    acc[T.ramp(v * lanes, 1, lanes)] = T.Broadcast(T.float32(0), lanes)
                for g in T.serial(groups):
                    for h in T.unroll(2):
                        for v in T.unroll(pv):
                            part[h, T.ramp(v * lanes, 1, lanes)] = T.Broadcast(T.float32(0), lanes)
                    for c in T.unroll(chunks):
                        for v in T.unroll(pv):
                            for i in T.unroll(NIBBLES):
                                part[i % 2, T.ramp(v * lanes, 1, lanes)] = fma(
                                    T.Broadcast(x[0, g * GROUP + c * NIBBLES + i], lanes),
                                    value(packed[t, g * chunks + c, T.ramp(p * width + v * lanes, 1, lanes)], i,
                                          lanes),
                                    part[i % 2, T.ramp(v * lanes, 1, lanes)])
                    for v in T.unroll(pv):
                        acc[T.ramp(v * lanes, 1, lanes)] = fma(
                            part[0, T.ramp(v * lanes, 1, lanes)] + part[1, T.ramp(v * lanes, 1, lanes)],
                            T.Cast(f"float32x{lanes}", scales[t, g, T.ramp(p * width + v * lanes, 1, lanes)]),
                            acc[T.ramp(v * lanes, 1, lanes)])
                for v in T.unroll(pv):
                    y[0, T.ramp(t * BLOCK + p * width + v * lanes, 1, lanes)] = acc[T.ramp(v * lanes, 1, lanes)]

    form = f"{n} {k} {len(lead)} {scale} {int(lut)} {lanes} {pv}"
    plan = f"int4 weights, float32 sums: {'lookup' if lut else 'shifts'}, {lanes} lanes, passes of {pv} vectors"
    return _named(kernel, name, INT4_GEMV_ATTR, form, plan)


@T.macro
def _quantize_group(x, base, g, q, xs, xc, lanes, offset):
    """Group ``g`` of row ``x`` (its first input at ``base``): its scale ``xs[g]`` (NaN when
    it holds a NaN or an infinity), its int8 values into the local int32 ``q [GROUP]`` and
    ``xc[g] = offset * sum(q)`` (the weights' offset to unsigned bytes, ``_offset``)."""
    peak = T.decl_buffer((lanes,), "float32", scope="local")
    top = T.decl_buffer((1,), "float32", scope="local")
    bad = T.decl_buffer((1,), "int32", scope="local")
    for j in T.vectorized(lanes):
        peak[j] = T.fabs(x[base + j])
    for c in T.unroll(1, GROUP // lanes):
        for j in T.vectorized(lanes):
            peak[j] = T.max(peak[j], T.fabs(x[base + c * lanes + j]))
    top[0] = peak[0]
    for j in T.unroll(1, lanes):
        top[0] = T.max(top[0], peak[j])
    bad[0] = 0  # an exponent of all ones: an infinity or a NaN (integer bits: no float rewrite)
    for i in T.serial(GROUP):
        bad[0] = bad[0] | T.Cast("int32", T.bitwise_and(T.reinterpret(x[base + i], dtype="int32"), _EXPONENT)
                                 == _EXPONENT)
    scale = T.meta_var(T.Select(top[0] > T.float32(0), top[0] / T.float32(Q8_MAX), T.float32(1)))
    for i in T.vectorized(GROUP):
        q[i] = T.Cast("int32", T.max(T.min(T.nearbyint(x[base + i] / scale), T.float32(Q8_MAX)),
                                     T.float32(-Q8_MAX)))
    xs[g] = T.Select(bad[0] != 0, T.float32("nan"), scale)
    xc[g] = 0
    for i in T.serial(GROUP):
        xc[g] = xc[g] + offset * q[i]


def _offset(bits: int) -> int:
    """What the q8 kernels add to each weight to make it an unsigned byte: 8 for int4
    (``[-8, 7]`` to ``[0, 15]``), 128 for int8 (``[-127, 127]`` to ``[1, 255]``)."""
    return 1 << (bits - 1)


def _words(k: int, bits: int) -> int:
    """int32 words of a weight row of ``k`` inputs: 8 int4 or 4 int8 weights each."""
    return k * bits // 32


def _weight_bytes(packed: tirx.Buffer, t, column, g, e, lanes: int, bits: int) -> tirx.Expr:
    """Unsigned bytes (the weights plus ``_offset``) of the ``lanes`` outputs from ``column``
    of task ``t`` for the ``e``-th 4 inputs of group ``g`` in ``_row_byte``'s order. int4:
    word ``4g + e // 2`` offset by 0x88888888, shifted by ``4 (e % 2)``, its low nibbles
    masked (the weights ``8 (e // 2) + 2b + e % 2``); int8: word ``8g + e`` offset by
    0x80808080 (the weights ``4e + b``)."""
    columns = tirx.Ramp(column, 1, lanes) if lanes > 1 else column
    if bits == 8:
        word = tirx.bitwise_xor(packed[t, g * 8 + e, columns], _int32(_OFFSET8, lanes))
        return T.reinterpret(word, dtype=f"int8x{4 * lanes}")
    word = tirx.bitwise_xor(packed[t, g * 4 + e // 2, columns], _int32(_OFFSET, lanes))
    nibbles = tirx.bitwise_and(tirx.shift_right(word, _int32(4 * (e % 2), lanes)), _int32(_LOW_NIBBLES, lanes))
    return T.reinterpret(nibbles, dtype=f"int8x{4 * lanes}")


def _row_byte(e, b, bits: int):
    """Which input of its group the row's byte ``4e + b`` holds: int4 the even 4 of each 8
    inputs, then the odd 4 (as the nibbles come out of a word); int8 in order."""
    return e * 4 + b if bits == 8 else e // 2 * NIBBLES + 2 * b + e % 2


def _broadcast_bytes(four: tirx.Expr, lanes: int) -> tirx.Expr:
    """The 4 bytes ``four`` (int8x4) repeated in each of ``lanes`` int32 lanes."""
    return T.reinterpret(T.Broadcast(T.reinterpret(four, dtype="int32"), lanes), dtype=f"int8x{4 * lanes}")


def vpdpbusd(acc: tirx.Expr, a: tirx.Expr, b: tirx.Expr) -> tirx.Expr:
    """AVX-512 VNNI's ``vpdpbusd``: to each int32 lane of ``acc`` the four products of its
    unsigned bytes of ``a`` by its signed bytes of ``b`` (no saturation: int32 sums)."""
    return T.call_llvm_pure_intrin("int32x16", "llvm.x86.avx512.vpdpbusd.512", acc, a, b)


def gemv_int4_q8(n: int, k: int, name: str = "gemv_int4_q8", scale: str = "float16",
                 lead: tuple[int, ...] = (1,), pass_vectors: int = 2, vnni: bool = False,
                 bits: int = 4) -> tirx.PrimFunc:
    """``y [*lead, N] = linear(q * s, W)`` for one row with int8 activations (module
    docstring), in AVX2's 8 int32 lanes, or with ``vnni`` AVX-512's 16 and ``vpdpbusd``
    (each 4 products added into int32 at once); a task's ``BLOCK`` outputs are summed
    ``pass_vectors`` vectors at a time (``int4_form``). ``bits=8``: the int8 weights of
    ``pack_int8`` (VNNI only: ``vpmaddubsw`` could saturate on ``255 * 127`` pairs)."""
    if any(d != 1 for d in lead):
        raise ValueError(f"gemv_int4_q8: one row, not {lead}")
    _check_bits(bits, vnni)
    lanes = Q8_VNNI_LANES if vnni else Q8_LANES
    tasks, groups = n // BLOCK, k // GROUP
    vectors = BLOCK // lanes
    pv = pass_vectors
    if vectors % pv:
        raise ValueError(f"gemv_int4_q8: {BLOCK} outputs a task are not whole passes of {pv} x {lanes} lanes")
    width = pv * lanes
    scale_groups = groups if bits == 4 else 1

    @T.prim_func
    def kernel(x_in: T.Buffer((*lead, k), "float32"), packed: T.Buffer((tasks, _words(k, bits), BLOCK), "int32"),
               scales: T.Buffer((tasks, scale_groups, BLOCK), scale), y_out: T.Buffer((*lead, n), "float32")):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "aicf.kind": "linear_int4"})
        x = T.decl_buffer((k,), "float32", data=x_in.data)
        y = T.decl_buffer((n,), "float32", data=y_out.data)
        xq = T.decl_buffer((k,), "int8")  # the row's bytes in _row_byte's order
        xs = T.decl_buffer((groups,), "float32")
        xc = T.decl_buffer((groups,), "int32")
        q = T.decl_buffer((GROUP,), "int32", scope="local")
        for g in T.serial(groups):
            _quantize_group(x, g * GROUP, g, q, xs, xc, Q8_LANES, _offset(bits))
            for e in T.unroll(HALVES):
                for b in T.unroll(4):
                    xq[g * GROUP + e * 4 + b] = T.Cast("int8", q[_row_byte(e, b, bits)])
        for t in T.parallel(tasks):
            for p in T.serial(vectors // pv):
                acc = T.decl_buffer((width,), "float32", scope="local")
                pairs = T.decl_buffer((pv * 16,), "int16", scope="local")  # AVX2: int16 pair sums
                dots = T.decl_buffer((width,), "int32", scope="local")  # VNNI: int32 sums
                for v in T.unroll(pv):
                    acc[T.ramp(v * lanes, 1, lanes)] = T.Broadcast(T.float32(0), lanes)
                for g in T.serial(groups):
                    for v in T.unroll(pv):
                        if vnni:
                            dots[T.ramp(v * lanes, 1, lanes)] = T.Broadcast(T.int32(0) - xc[g], lanes)
                        else:
                            pairs[T.ramp(v * 16, 1, 16)] = T.Broadcast(T.int16(0), 16)
                    for e in T.unroll(HALVES):
                        xb = T.meta_var(_broadcast_bytes(xq.vload([g * GROUP + e * 4], "int8x4"), lanes))
                        for v in T.unroll(pv):
                            w = T.meta_var(_weight_bytes(packed, t, p * width + v * lanes, g, e, lanes, bits))
                            if vnni:
                                dots[T.ramp(v * lanes, 1, lanes)] = vpdpbusd(dots[T.ramp(v * lanes, 1, lanes)], w, xb)
                            else:
                                pairs[T.ramp(v * 16, 1, 16)] = pairs[T.ramp(v * 16, 1, 16)] + pmaddubsw(w, xb)
                    for v in T.unroll(pv):
                        sums = T.meta_var(dots[T.ramp(v * lanes, 1, lanes)] if vnni  # from -xc[g]
                                          else pmaddwd_ones(pairs[T.ramp(v * 16, 1, 16)]) - T.Broadcast(xc[g], lanes))
                        acc[T.ramp(v * lanes, 1, lanes)] = fma(
                            T.Cast(f"float32x{lanes}", sums),
                            T.Cast(f"float32x{lanes}",
                                   scales[t, g if bits == 4 else 0, T.ramp(p * width + v * lanes, 1, lanes)])
                            * T.Broadcast(xs[g], lanes),
                            acc[T.ramp(v * lanes, 1, lanes)])
                for v in T.unroll(pv):
                    y[T.ramp(t * BLOCK + p * width + v * lanes, 1, lanes)] = acc[T.ramp(v * lanes, 1, lanes)]

    form = f"{n} {k} {len(lead)} {scale} {pv} {int(vnni)} {bits}"
    return _named(kernel, name, INT4_GEMV_Q8_ATTR, form, f"{_q8_plan(bits, vnni, lanes)}, passes of {pv} vectors")


def _check_bits(bits: int, vnni: bool) -> None:
    if bits not in (4, 8):
        raise ValueError(f"q8 kernels: {bits}-bit weights; expected 4 or 8")
    if bits == 8 and not vnni:
        raise ValueError("q8 kernels: int8 weights need the VNNI form (vpmaddubsw would saturate 255 x 127 pairs)")


def linear_int4(n: int, k: int, name: str = "linear_int4", scale: str = "float16", rows: int = QUAD,
                columns: int = BLOCK, row_block: int = ROW_BLOCK) -> tirx.PrimFunc:
    """``y [M, N] = x [M, K] @ W.T`` for any number of rows ``M`` (module docstring):
    ``rows`` x ``columns`` sums in registers (``columns`` dividing ``BLOCK``), a task
    ``row_block`` rows of one ``BLOCK`` of outputs (``int4_form``)."""
    tasks, groups, chunks = n // BLOCK, k // GROUP, GROUP // NIBBLES
    if BLOCK % columns:
        raise ValueError(f"linear_int4: {columns} columns a register tile do not divide {BLOCK}")

    @T.macro
    def sums(x, y, packed, scales, m_rows):
        for tm in T.parallel(tasks * ((m_rows + row_block - 1) // row_block)):
            t = T.meta_var(tm % tasks)
            mb = T.meta_var(tm // tasks)
            count = T.meta_var(T.min(row_block, m_rows - mb * row_block))  # this task's rows
            quads = T.meta_var(count // rows * rows)  # those in whole register tiles
            tile = T.decl_buffer((GROUP, BLOCK), "float32", scope="local")
            acc = T.decl_buffer((row_block, BLOCK), "float32", scope="local")
            for m in T.serial(count):
                for j in T.vectorized(BLOCK):
                    acc[m, j] = T.float32(0)
            for g in T.serial(groups):
                for c in T.serial(chunks):
                    for i in T.unroll(NIBBLES):
                        for j in T.vectorized(BLOCK):
                            tile[c * NIBBLES + i, j] = _signed_nibble(packed[t, g * chunks + c, j], i, 1) \
                                * T.Cast("float32", scales[t, g, j])
                # rows x columns sums in registers at a time
                for q in T.serial(count // rows):
                    for cc in T.serial(BLOCK // columns):
                        regs = T.decl_buffer((rows, columns), "float32", scope="local")
                        for r in T.unroll(rows):
                            for j in T.vectorized(columns):
                                regs[r, j] = acc[q * rows + r, cc * columns + j]
                        for i in T.unroll(GROUP):
                            for r in T.unroll(rows):
                                for j in T.vectorized(columns):
                                    regs[r, j] = fma(x[mb * row_block + q * rows + r, g * GROUP + i],
                                                     tile[i, cc * columns + j], regs[r, j])
                        for r in T.unroll(rows):
                            for j in T.vectorized(columns):
                                acc[q * rows + r, cc * columns + j] = regs[r, j]
                for m in T.serial(count % rows):
                    for i in T.unroll(GROUP):
                        for j in T.vectorized(BLOCK):
                            acc[quads + m, j] = fma(x[mb * row_block + quads + m, g * GROUP + i], tile[i, j],
                                                    acc[quads + m, j])
            for m in T.serial(count):
                for j in T.vectorized(BLOCK):
                    y[mb * row_block + m, t * BLOCK + j] = acc[m, j]

    @T.prim_func
    def kernel(var_x: T.handle, packed: T.Buffer((tasks, k // NIBBLES, BLOCK), "int32"),
               scales: T.Buffer((tasks, groups, BLOCK), scale), var_y: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "aicf.kind": "linear_int4"})
        m_rows = T.int64()
        x = T.match_buffer(var_x, (m_rows, k), "float32")
        y = T.match_buffer(var_y, (m_rows, n), "float32")
        sums(x, y, packed, scales, m_rows)

    form = f"{n} {k} {scale} {rows} {columns} {row_block}"
    plan = f"int4 weights, float32 sums: {rows} rows x {columns} columns, {row_block} rows a task"
    return _named(kernel, name, INT4_LINEAR_ATTR, form, plan)


def linear_int4_q8(n: int, k: int, name: str = "linear_int4_q8", scale: str = "float16", rows: int = Q8_ROWS,
                   vectors: int = 2, vnni: bool = False, row_block: int = ROW_BLOCK, bits: int = 4) -> tirx.PrimFunc:
    """``y [M, N] = linear(q * s, W)`` for any number of rows ``M`` with int8 activations
    (module docstring), in integers: each row rounded into a workspace first (its bytes in
    ``gemv_int4_q8``'s order, its groups' scales and ``8 * sum(q)``), in parallel over the
    rows; then a task owns ``row_block`` rows of one ``BLOCK`` of outputs and, per group,
    offsets the group's weights to bytes ``v + 8`` once into a stack tile that all its rows
    read, and sums ``rows`` x ``vectors`` vectors of outputs at a time from them: with
    ``vnni`` ``vpdpbusd`` into int32 (16 lanes), else ``vpmaddubsw`` into int16 pairs
    (8 lanes; at most ``8 * 2 * 15 * 127 = 30480``), then ``vpmaddwd`` by ones; each sum
    less ``8 * sum(q)``, times ``scale * s``, added to the row's float sums. ``bits=8``:
    the int8 weights of ``pack_int8`` (VNNI only), offset by 128."""
    _check_bits(bits, vnni)
    tasks, groups = n // BLOCK, k // GROUP
    scale_groups = groups if bits == 4 else 1
    lanes = Q8_VNNI_LANES if vnni else Q8_LANES
    columns = vectors * lanes
    if BLOCK % columns:
        raise ValueError(f"linear_int4_q8: {vectors} x {lanes} columns a register tile do not divide {BLOCK}")

    @T.macro
    def tile_sums(xq, xs, xc, tile, acc, scales, t, g, row, local_row, column, count):
        """``count`` rows from ``row`` (``local_row`` in ``acc``) x ``columns`` outputs from
        ``column``: group ``g``'s integer sums, then into ``acc``."""
        dots = T.decl_buffer((count, columns), "int32", scope="local")
        pairs = T.decl_buffer((count, vectors * 16), "int16", scope="local")
        for r in T.unroll(count):
            for v in T.unroll(vectors):
                if vnni:
                    dots[r, T.ramp(v * lanes, 1, lanes)] = T.Broadcast(T.int32(0) - xc[row + r, g], lanes)
                else:
                    pairs[r, T.ramp(v * 16, 1, 16)] = T.Broadcast(T.int16(0), 16)
        for e in T.unroll(HALVES):
            for r in T.unroll(count):
                xb = T.meta_var(_broadcast_bytes(xq.vload([row + r, g * GROUP + e * 4], "int8x4"), lanes))
                for v in T.unroll(vectors):
                    w = T.meta_var(T.reinterpret(tile[e, T.ramp(column + v * lanes, 1, lanes)],
                                                 dtype=f"int8x{4 * lanes}"))
                    if vnni:
                        dots[r, T.ramp(v * lanes, 1, lanes)] = vpdpbusd(dots[r, T.ramp(v * lanes, 1, lanes)], w, xb)
                    else:
                        pairs[r, T.ramp(v * 16, 1, 16)] = pairs[r, T.ramp(v * 16, 1, 16)] + pmaddubsw(w, xb)
        for r in T.unroll(count):
            for v in T.unroll(vectors):
                sums = T.meta_var(dots[r, T.ramp(v * lanes, 1, lanes)] if vnni else  # from -xc
                                  pmaddwd_ones(pairs[r, T.ramp(v * 16, 1, 16)]) - T.Broadcast(xc[row + r, g], lanes))
                acc[local_row + r, T.ramp(column + v * lanes, 1, lanes)] = fma(
                    T.Cast(f"float32x{lanes}", sums),
                    T.Cast(f"float32x{lanes}", scales[t, g if bits == 4 else 0, T.ramp(column + v * lanes, 1, lanes)])
                    * T.Broadcast(xs[row + r, g], lanes),
                    acc[local_row + r, T.ramp(column + v * lanes, 1, lanes)])

    @T.prim_func
    def kernel(var_x: T.handle, packed: T.Buffer((tasks, _words(k, bits), BLOCK), "int32"),
               scales: T.Buffer((tasks, scale_groups, BLOCK), scale), var_y: T.handle):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "aicf.kind": "linear_int4"})
        m_rows = T.int64()
        x = T.match_buffer(var_x, (m_rows, k), "float32")
        y = T.match_buffer(var_y, (m_rows, n), "float32")
        xq = T.decl_buffer((m_rows, k), "int8")  # in _row_byte's order
        xs = T.decl_buffer((m_rows, groups), "float32")
        xc = T.decl_buffer((m_rows, groups), "int32")
        flat = T.decl_buffer((m_rows * k,), "float32", data=x.data)
        xs_flat = T.decl_buffer((m_rows * groups,), "float32", data=xs.data)
        xc_flat = T.decl_buffer((m_rows * groups,), "int32", data=xc.data)
        for m in T.parallel(m_rows):
            q = T.decl_buffer((GROUP,), "int32", scope="local")
            for g in T.serial(groups):
                _quantize_group(flat, m * k + g * GROUP, m * groups + g, q, xs_flat, xc_flat, Q8_LANES, _offset(bits))
                for e in T.unroll(HALVES):
                    for b in T.unroll(4):
                        xq[m, g * GROUP + e * 4 + b] = T.Cast("int8", q[_row_byte(e, b, bits)])
        for tm in T.parallel(tasks * ((m_rows + row_block - 1) // row_block)):
            t = T.meta_var(tm % tasks)
            mb = T.meta_var(tm // tasks)
            count = T.meta_var(T.min(row_block, m_rows - mb * row_block))  # this task's rows
            whole = T.meta_var(count // rows * rows)  # those in whole register tiles
            tile = T.decl_buffer((HALVES, BLOCK), "int32", scope="local")
            acc = T.decl_buffer((row_block, BLOCK), "float32", scope="local")
            for m in T.serial(count):
                for j in T.vectorized(BLOCK):
                    acc[m, j] = T.float32(0)
            for g in T.serial(groups):
                for e in T.unroll(HALVES):
                    for j in T.vectorized(BLOCK):
                        tile[e, j] = T.reinterpret(_weight_bytes(packed, t, j, g, e, 1, bits), dtype="int32")
                for qq in T.serial(count // rows):
                    for cc in T.serial(BLOCK // columns):
                        tile_sums(xq, xs, xc, tile, acc, scales, t, g, mb * row_block + qq * rows, qq * rows,
                                  cc * columns, rows)
                for m in T.serial(count - whole):
                    for cc in T.serial(BLOCK // columns):
                        tile_sums(xq, xs, xc, tile, acc, scales, t, g, mb * row_block + whole + m, whole + m,
                                  cc * columns, 1)
            for m in T.serial(count):
                for j in T.vectorized(BLOCK):
                    y[mb * row_block + m, t * BLOCK + j] = acc[m, j]

    form = f"{n} {k} {scale} {rows} {vectors} {row_block} {int(vnni)} {bits}"
    plan = f"{_q8_plan(bits, vnni, lanes)}, {rows} rows x {vectors} vectors, {row_block} rows a task"
    return _named(kernel, name, INT4_LINEAR_Q8_ATTR, form, plan)


def has_lut(target: Target) -> bool:
    """Whether ``gemv_int4``'s lookup form runs on ``target`` (AVX-512)."""
    return target.kind.name == "llvm" and _has_feature(target, "avx512f")


def int4_form(target: Target) -> dict[str, int | bool]:
    """The kernels' register blocking for ``target``, from its float32 lanes and vector
    registers: ``linear_int4`` keeps half the registers as sums (AVX-512: 4 rows x 4
    vectors; AVX2: 1 row x 8 vectors), ``gemv_int4`` sums passes of outputs whose three
    vectors each (the sum and two partial chains) fill at most three quarters of them
    (AVX-512: the whole block of 4 vectors, AVX2: 4 of its 8).

    Measured on Zen 3 (AVX2, 2 threads, float16 scales): ``linear_int4`` at 128 rows took
    4.8-4.9 ms for 2816 x 1024 with 1 row x 8 vectors, 5.0-5.2 with 2 x 4, 6.3-6.9 with
    2 x 2, 4 x 1 or 8 x 1, 7.7-8.7 with 3 x 2 or 6 x 2, 14.0 with AVX-512's 4 rows x 8
    vectors (32 sums, twice the registers); ``gemv_int4``, 32000 x 1024: 2.00 ms in
    passes of 4 vectors, 2.05 of 2, 2.12 of 8, 2.44 of 1, 2.22 with AVX-512's 16-lane
    vectors.

    The int8 activations' kernels: the VNNI form where the target has AVX-512 VNNI
    (``q8_vnni``), AVX2's otherwise; ``gemv_int4_q8`` in passes of as many vectors as fit
    two sums each beside ten other registers (``q8_pass_vectors``: VNNI 4, AVX2 2),
    ``linear_int4_q8`` in tiles of ``Q8_ROWS`` (2) rows x ``q8_vectors`` vectors, a quarter
    of the registers as sums (VNNI 4, AVX2 2). Measured on Zen 4 (2 threads): the VNNI GEMV
    on 32000 x 1024 0.169 ms in passes of 4, 0.219 of 2, 0.294 of 1; the prompt's kernel at
    128 rows on 2816 x 1024 1.19 ms in 2 x 4 tiles, 1.22 in 2 x 2, 1.25 in 4 x 4, 1.56-1.76
    in 4, 6 and 8 rows x 2 (AVX2's form there: 1.53 in 2 x 2, 1.55-1.66 in 2 x 4, 4 x 1,
    4 x 2, 6 x 1, 3 x 2)."""
    lanes = float32_lanes(target)
    registers = vector_registers(target)
    vectors = BLOCK // lanes if BLOCK % lanes == 0 else 1
    sums = registers // 2
    rows = max(1, sums // vectors)
    columns = min(BLOCK, sums * lanes)
    pass_vectors = max(d for d in range(1, vectors + 1) if vectors % d == 0 and 4 * d <= registers)
    vnni = has_vnni(target)
    q8_vectors = BLOCK // (Q8_VNNI_LANES if vnni else Q8_LANES)  # gemv_int4_q8: two sums a vector, ten others
    q8_pass = max(d for d in range(1, q8_vectors + 1) if q8_vectors % d == 0 and (2 * d + 10 <= registers or d == 1))
    q8_tile = max(1, min(q8_vectors, registers // (4 * Q8_ROWS)))  # linear_int4_q8: a quarter as sums
    return {"lut": has_lut(target), "lanes": lanes if BLOCK % lanes == 0 else 1, "pass_vectors": pass_vectors,
            "rows": rows, "columns": columns, "row_block": rows * (ROW_BLOCK // rows), "q8_pass_vectors": q8_pass,
            "q8_vnni": vnni, "q8_vectors": q8_tile}


def has_q8(target: Target, bits: int = 4) -> bool:
    """Whether the int8 activations' kernels run on ``target`` with ``bits``-bit weights: an
    x86 CPU with AVX2 for int4, with AVX-512 VNNI for int8 (whose unsigned weight bytes
    reach 255: ``vpmaddubsw``'s int16 pairs would saturate)."""
    if target.kind.name != "llvm":
        return False
    return has_vnni(target) if bits == 8 else _has_feature(target, "avx2")


KERNEL_FORMS = (INT4_GEMV_ATTR, INT4_GEMV_Q8_ATTR, INT4_LINEAR_ATTR, INT4_LINEAR_Q8_ATTR)


def with_outputs(func: tirx.PrimFunc, n: int, name: str) -> tirx.PrimFunc:
    """The kernel ``func`` (one of this module's, by its form attribute) for ``n`` outputs,
    everything else as it is, named ``name``."""
    attrs = func.attrs
    if INT4_GEMV_ATTR in attrs:
        _n, k, rank, scale, lut, lanes, pv = str(attrs[INT4_GEMV_ATTR]).split()
        return gemv_int4(n, int(k), name, scale, lut == "1", (1,) * int(rank), int(lanes), int(pv))
    if INT4_GEMV_Q8_ATTR in attrs:
        _n, k, rank, scale, pv, vnni, bits = str(attrs[INT4_GEMV_Q8_ATTR]).split()
        return gemv_int4_q8(n, int(k), name, scale, (1,) * int(rank), int(pv), vnni == "1", int(bits))
    if INT4_LINEAR_ATTR in attrs:
        _n, k, scale, rows, columns, row_block = str(attrs[INT4_LINEAR_ATTR]).split()
        return linear_int4(n, int(k), name, scale, int(rows), int(columns), int(row_block))
    _n, k, scale, rows, vectors, row_block, vnni, bits = str(attrs[INT4_LINEAR_Q8_ATTR]).split()
    return linear_int4_q8(n, int(k), name, scale, int(rows), int(vectors), vnni == "1", int(row_block), int(bits))


def _refuse_without_q8(name: str, target: Target, bits: int = 4) -> None:
    if not has_q8(target, bits):
        need = "AVX-512 VNNI (vpdpbusd)" if bits == 8 else "AVX2 (vpmaddubsw)"
        raise ValueError(f"{name}: int8 activations with int{bits} weights need an x86 CPU with {need}; the "
                         f"target {target} has none")


def for_target(mod: IRModule, target: Target) -> IRModule:
    """``mod`` with each int4 kernel in the form for ``target`` (``int4_form``): the
    importer builds them for AVX-512's registers, not knowing the target
    (``aicf_tvm.driver.frontends.int4``)."""
    form = int4_form(target)
    out = mod
    for gv, func in mod.functions_items():
        attrs = func.attrs if isinstance(func, tirx.PrimFunc) else None
        if attrs is None:
            continue
        name = str(attrs.get("global_symbol", gv.name_hint))
        if INT4_GEMV_ATTR in attrs:
            n, k, rank, scale, *_ = str(attrs[INT4_GEMV_ATTR]).split()
            rebuilt = gemv_int4(int(n), int(k), name, scale, bool(form["lut"]), (1,) * int(rank),
                                int(form["lanes"]), int(form["pass_vectors"]))
            before = str(attrs[INT4_GEMV_ATTR])
            after = str(rebuilt.attrs[INT4_GEMV_ATTR])
        elif INT4_GEMV_Q8_ATTR in attrs:
            n, k, rank, scale, *_, bits = str(attrs[INT4_GEMV_Q8_ATTR]).split()
            _refuse_without_q8(name, target, int(bits))
            rebuilt = gemv_int4_q8(int(n), int(k), name, scale, (1,) * int(rank), int(form["q8_pass_vectors"]),
                                   bool(form["q8_vnni"]), int(bits))
            before, after = str(attrs[INT4_GEMV_Q8_ATTR]), str(rebuilt.attrs[INT4_GEMV_Q8_ATTR])
        elif INT4_LINEAR_ATTR in attrs:
            n, k, scale, *_ = str(attrs[INT4_LINEAR_ATTR]).split()
            rebuilt = linear_int4(int(n), int(k), name, scale, int(form["rows"]), int(form["columns"]),
                                  int(form["row_block"]))
            before, after = str(attrs[INT4_LINEAR_ATTR]), str(rebuilt.attrs[INT4_LINEAR_ATTR])
        elif INT4_LINEAR_Q8_ATTR in attrs:
            n, k, scale, *_, bits = str(attrs[INT4_LINEAR_Q8_ATTR]).split()
            _refuse_without_q8(name, target, int(bits))
            rebuilt = linear_int4_q8(int(n), int(k), name, scale, Q8_ROWS, int(form["q8_vectors"]),
                                     bool(form["q8_vnni"]), bits=int(bits))
            before, after = str(attrs[INT4_LINEAR_Q8_ATTR]), str(rebuilt.attrs[INT4_LINEAR_Q8_ATTR])
        else:
            continue
        if before == after:
            continue
        out = out.clone() if out is mod else out
        out[gv] = rebuilt
    return out


__all__ = ["BLOCK", "GROUP", "KERNEL_FORMS", "NIBBLES", "Q8_MAX", "fits_int4", "for_target", "gemv_int4",
           "gemv_int4_q8", "has_lut", "has_q8", "int4_form", "linear_int4", "linear_int4_q8", "pack_int4", "pack_int8",
           "scale_dtype", "vpdpbusd", "with_outputs"]
