"""Legalization of conv2d in blocked layouts (``NCHW16c``), which TVM's own conv2d
legalization refuses ("channel chunk ... cannot be legalized by TOPI").

Three forms, the ones ``MaterializeEmits`` writes (``relax_passes.materialize_layouts``):

* dense (``groups == 1``): data ``NCHW{ib}c`` (or plain ``NCHW``: a network's first
  convolution reads its input as is), kernel ``OIHW{ib}i{ob}o`` (``OIHW1i{ob}o`` for plain
  data), output ``NCHW{ob}c``::

      out[n, o, y, x, j] = sum(c, r, q, i) pad[n, c, y*s + r*d, x*s + q*d, i] * w[o, c, r, q, i, j]

* grouped (``1 < groups``, each group's input and output channels, ``C/groups`` and
  ``O/groups``, multiples of ``ib`` and ``ob``): data ``NCHW{ib}c``, kernel
  ``OIHW{ib}i{ob}o`` whose I dimension is one group's input channels (``C/groups``, as
  in OIHW), output ``NCHW{ob}c``. Output block ``o`` lies in group ``g = o // (O/groups/ob)``
  and reduces over that group's ``K = C/groups/ib`` input blocks only::

      out[n, o, y, x, j] = sum(c < K, r, q, i) pad[n, g*K + c, y*s + r*d, x*s + q*d, i] * w[o, c, r, q, i, j]

  Because the blocks divide the group widths, no block holds channels of two groups:
  channel ``(g*K + c)*ib + i`` is the group's input channel ``c*ib + i``, as the plain
  grouped convolution reads it.

* depthwise (``groups`` == channels == output channels): data and output ``NCHW{b}c``,
  kernel ``OIHW1i{b}o``::

      out[n, o, y, x, j] = sum(r, q) pad[n, o, y*s + r*d, x*s + q*d, j] * w[o, 0, r, q, 0, j]

* dense over unsigned 8-bit data and signed 8-bit weights into int32 (``is_vnni_form``:
  the input block a multiple of 4, the output block 16): the kernel is first copied to
  ``[O/ob, C/ib, kh, kw, ib/4, ob, 4]`` (four consecutive input channels of one output
  channel side by side, the operand order of AVX-512 VNNI's ``vpdpbusd``), and the sum
  runs over ``i = 4*io + i4``::

      out[n, o, y, x, j] = sum(c, r, q, io, i4) pad[n, c, y*s + r*d, x*s + q*d, 4*io + i4] * wv[o, c, r, q, io, j, i4]

  the same products as the dense form, summed in int32 (exact in any order: the caller
  checks the sums cannot overflow).

``pad`` is the input padded with +0.0 (asymmetric ``(top, left, bottom, right)`` as the op
states it), omitted when the padding is zero. Channel ``c*b + i`` of the logical tensor is
element ``[.., c, .., i]`` of the blocked one, so each form is the plain convolution read
through that index map: the same sums of the same products. The multiply-accumulate runs
in ``out_dtype`` (the data dtype when unset), as TOPI's convolution does.
"""

from __future__ import annotations

import re

import tvm
from tvm import te, tirx

from aicf_tvm.core.tvm_values import static_shape

_DATA = re.compile(r"^NCHW(?:(\d+)c)?$")
_KERNEL = re.compile(r"^OIHW(\d+)i(\d+)o$")


def data_block(layout: str) -> int | None:
    """The channel block of a data layout: 16 for ``NCHW16c``, 0 for ``NCHW``, None when neither."""
    m = _DATA.match(layout)
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) else 0


def kernel_blocks(layout: str) -> tuple[int, int] | None:
    """``(ib, ob)`` of ``OIHW{ib}i{ob}o``, None for anything else."""
    m = _KERNEL.match(layout)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def _padded(data: te.Tensor, padding: tuple[int, ...], h_axis: int) -> te.Tensor:
    top, left, bottom, right = padding
    if not any(padding):
        return data
    shape = list(data.shape)
    height, width = shape[h_axis], shape[h_axis + 1]
    shape[h_axis], shape[h_axis + 1] = height + top + bottom, width + left + right

    def value(*idx):
        y, x = idx[h_axis], idx[h_axis + 1]
        inside = tirx.all(y >= top, y < height + top, x >= left, x < width + left)
        src = list(idx)
        src[h_axis], src[h_axis + 1] = y - top, x - left
        return tirx.if_then_else(inside, data(*src), tirx.const(0, data.dtype))

    return te.compute(shape, value, name="pad_temp")


def conv2d_blocked(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, groups: int,
                   data_layout: str, kernel_layout: str, out_dtype: str) -> te.Tensor:
    """The TE compute of the module docstring (the caller has checked the form)."""
    ib = data_block(data_layout)
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    blocks, kin, kh, kw, kib, ob = (int(d) for d in kernel.shape)
    pad = _padded(data, tuple(int(p) for p in padding), 2)
    height = (int(pad.shape[2]) - dh * (kh - 1) - 1) // sh + 1
    width = (int(pad.shape[3]) - dw * (kw - 1) - 1) // sw + 1
    shape = (data.shape[0], blocks, height, width, ob)
    r = te.reduce_axis((0, kh), "ry")
    q = te.reduce_axis((0, kw), "rx")

    def cast(x: tvm.ir.Expr) -> tvm.ir.Expr:
        return x.astype(out_dtype) if x.dtype != out_dtype else x

    if groups > 1 and kib == 1:  # depthwise: channel o*b + j reads its own input channel
        return te.compute(shape, lambda n, o, y, x, j: te.sum(
            cast(pad[n, o, y * sh + r * dh, x * sw + q * dw, j]) * cast(kernel[o, 0, r, q, 0, j]),
            axis=[r, q]), name="conv2d_nchwc", tag="conv2d_nchwc")
    c = te.reduce_axis((0, kin), "rc")
    if ib == 0:  # plain NCHW data: kernel [O/ob, C, kh, kw, 1, ob]
        return te.compute(shape, lambda n, o, y, x, j: te.sum(
            cast(pad[n, c, y * sh + r * dh, x * sw + q * dw]) * cast(kernel[o, c, r, q, 0, j]),
            axis=[c, r, q]), name="conv2d_nchwc", tag="conv2d_nchwc")
    if is_vnni_form(data.dtype, kernel.dtype, out_dtype, groups, ib, ob):
        return _conv2d_vnni(pad, kernel, (sh, sw), (dh, dw), shape)
    i = te.reduce_axis((0, ib), "ri")
    per_group = blocks // groups  # output blocks per group

    def block(o: tvm.ir.Expr) -> tvm.ir.Expr:  # input block c of output block o's group (dense: one group)
        return o // per_group * kin + c if groups > 1 else c

    return te.compute(shape, lambda n, o, y, x, j: te.sum(
        cast(pad[n, block(o), y * sh + r * dh, x * sw + q * dw, i]) * cast(kernel[o, c, r, q, i, j]),
        axis=[c, r, q, i]), name="conv2d_nchwc", tag="conv2d_nchwc")


VNNI_LANES = 16  # int32 accumulators of one vpdpbusd
VNNI_DEPTH = 4  # bytes each accumulator sums per vpdpbusd


def is_vnni_form(data_dtype: str, kernel_dtype: str, out_dtype: str, groups: int, ib: int, ob: int) -> bool:
    """uint8 data, int8 weights, int32 sums, dense, blocks that fit ``vpdpbusd``."""
    return (str(data_dtype), str(kernel_dtype), str(out_dtype)) == ("uint8", "int8", "int32") and groups == 1 \
        and ib > 0 and ib % VNNI_DEPTH == 0 and ob == VNNI_LANES


def _conv2d_vnni(pad: te.Tensor, kernel: te.Tensor, strides: tuple[int, int], dilation: tuple[int, int],
                 shape: tuple) -> te.Tensor:
    blocks, kin, kh, kw, ib, ob = (int(d) for d in kernel.shape)
    (sh, sw), (dh, dw) = strides, dilation
    depth = VNNI_DEPTH
    wv = te.compute((blocks, kin, kh, kw, ib // depth, ob, depth),
                    lambda o, c, r, q, io, j, i4: kernel[o, c, r, q, io * depth + i4, j], name="kernel_vnni")
    c = te.reduce_axis((0, kin), "rc")
    r = te.reduce_axis((0, kh), "ry")
    q = te.reduce_axis((0, kw), "rx")
    io = te.reduce_axis((0, ib // depth), "rio")
    i4 = te.reduce_axis((0, depth), "ri4")
    return te.compute(shape, lambda n, o, y, x, j: te.sum(
        pad[n, c, y * sh + r * dh, x * sw + q * dw, io * depth + i4].astype("int32")
        * wv[o, c, r, q, io, j, i4].astype("int32"), axis=[c, r, q, io, i4]), name="conv2d_nchwc_vnni",
        tag="conv2d_nchwc")


def is_blocked_form(data_shape, kernel_shape, groups: int, data_layout: str, kernel_layout: str,
                    out_layout: str) -> bool:
    """Whether the layouts and shapes are one of the three forms of the module docstring."""
    ib, kb, obk = data_block(data_layout), kernel_blocks(kernel_layout), data_block(out_layout)
    if ib is None or kb is None or not obk or kb[1] != obk or len(kernel_shape) != 6:
        return False
    if ib == 0 and data_layout == out_layout:
        return False
    if groups == 1:
        return kb[0] == max(ib, 1) and int(kernel_shape[4]) == kb[0]
    channels = data_shape[1] * ib if ib else 0
    if ib > 1 and kb[0] == ib == int(kernel_shape[4]):  # grouped: whole blocks per group
        outputs = int(kernel_shape[0]) * obk
        return (channels % groups == 0 and int(kernel_shape[1]) * ib == channels // groups
                and outputs % groups == 0 and (outputs // groups) % obk == 0)
    return ib == obk and kb[0] == 1 and int(kernel_shape[1]) == 1 and groups == channels == int(kernel_shape[0]) * obk


def legalize_conv2d(bb: tvm.relax.BlockBuilder, call: tvm.relax.Call) -> tvm.relax.Expr:
    """``relax.nn.conv2d`` -> call_tir: blocked forms here, every other one as TVM does."""
    a = call.attrs
    data, kernel = call.args
    # MaterializeEmits blocks only static activations: a symbolic shape (None here) is never
    # one of the blocked forms and takes TVM's own legalization
    data_shape, kernel_shape = static_shape(data.ty), static_shape(kernel.ty)
    layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout))
    if data_shape is None or kernel_shape is None or not is_blocked_form(
            data_shape, kernel_shape, int(a.groups), *layouts):
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)  # TVM's own
    out_dtype = str(call.ty.dtype)  # out_dtype when set, else the data's (Relax inferred it)
    return bb.call_te(conv2d_blocked, data, kernel, strides=a.strides, padding=a.padding, dilation=a.dilation,
                      groups=int(a.groups), data_layout=layouts[0], kernel_layout=layouts[1],
                      out_dtype=out_dtype, primfunc_name_hint="conv2d_nchwc")


LEGALIZE_MAP = {"relax.nn.conv2d": legalize_conv2d}

__all__ = ["LEGALIZE_MAP", "VNNI_DEPTH", "VNNI_LANES", "conv2d_blocked", "data_block", "is_blocked_form",
           "is_vnni_form",
           "kernel_blocks", "legalize_conv2d"]
