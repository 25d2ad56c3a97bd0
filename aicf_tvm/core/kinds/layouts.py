"""Blocked channel layouts: their names, index maps and the layout transfer of ops
(the layout component of the shape fact, docs/design.md §3 C).

``NCHW{b}c`` stores channel ``c`` of a logical NCHW tensor at ``[n, c // b, h, w, c % b]``.
A result's layout is known only where an op states it (a convolution's or pool's
``out_layout``, a blocking ``layout_transform``) or carries it (an elementwise op on
operands of one layout, a spatial reduction that keeps its dims, a LayerNorm over the
blocked channels); everything else gets ⊤.
The selection of operands uses Relax types, not facts, so a stronger input fact never
gives a weaker output (monotone).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import tvm
from tvm import relax

from ..lattice import ShapeFact
from .registry import BROADCAST, ELEMENTWISE, NORM, REDUCTION, rule_for

_BLOCKED = re.compile(r"^NCHW(\d+)c$")
_LAYOUT_ATTR_OPS = {
    "relax.nn.conv2d": "out_layout", "relax.nn.max_pool2d": "out_layout", "relax.nn.avg_pool2d": "out_layout",
    "relax.nn.adaptive_avg_pool2d": "out_layout",
}


def blocked(block: int) -> str:
    return f"NCHW{block}c"


def block_of(layout: str | None) -> int | None:
    """16 for ``NCHW16c``; None for anything that is not a blocked NCHW layout."""
    m = _BLOCKED.match(layout or "")
    return int(m.group(1)) if m else None


def blocking_map(block: int) -> tvm.tirx.IndexMap:
    """NCHW -> NCHW{b}c."""
    return tvm.tirx.IndexMap.from_func(lambda n, c, h, w: (n, c // block, h, w, c % block))


def unblocking_map(block: int) -> tvm.tirx.IndexMap:
    """NCHW{b}c -> NCHW."""
    return tvm.tirx.IndexMap.from_func(lambda n, c, h, w, i: (n, c * block + i, h, w))


def transform_layouts(call: relax.Expr) -> tuple[str | None, str | None] | None:
    """``(from, to)`` of a blocking (``(None, "NCHW16c")``) or unblocking (``("NCHW16c",
    None)``) ``layout_transform`` call without padding; None for any other call."""
    if not _is_op(call, "relax.layout_transform") or call.attrs.pad_value is not None:
        return None
    ty = call.args[0].ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = [d for d in ty.shape.values]
    index_map = call.attrs.index_map
    out = call.ty.shape.values if isinstance(call.ty, relax.TensorType) and call.ty.shape is not None else []
    if len(dims) == 4 and len(out) == 5 and isinstance(out[4], tvm.tirx.IntImm):
        block = int(out[4])
        if index_map.is_equivalent_to(blocking_map(block)) and _divides(dims[1], block):
            return None, blocked(block)
    if len(dims) == 5 and isinstance(dims[4], tvm.tirx.IntImm):
        block = int(dims[4])
        if index_map.is_equivalent_to(unblocking_map(block)):
            return blocked(block), None
    return None


def _divides(dim: tvm.ir.Expr, block: int) -> bool:
    return isinstance(dim, tvm.tirx.IntImm) and int(dim) % block == 0


def _is_op(call: relax.Expr, name: str) -> bool:
    return isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == name


def _dims(ty: relax.Type) -> tuple[str, ...] | None:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return tuple(str(d) for d in ty.shape.values)


def output_layout(call: relax.Expr, ins: Sequence[ShapeFact]) -> str | None:
    """The layout of ``call``'s (single tensor) result given its tensor inputs' facts."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return None
    name = call.op.name
    if name in _LAYOUT_ATTR_OPS:
        layout = str(getattr(call.attrs, _LAYOUT_ATTR_OPS[name]))
        return layout if block_of(layout) else None
    moved = transform_layouts(call)
    if moved is not None:
        return moved[1]
    tensors = [a for a in call.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
    category = rule_for(name).category
    if category in (ELEMENTWISE, BROADCAST):
        out = _dims(call.ty)
        full = [f for a, f in zip(tensors, ins) if _dims(a.ty) == out]
        if not full:
            return None
        layout = full[0].layout
        return layout if all(f.layout == layout for f in full) else None
    if category == REDUCTION and ins and _keeps_blocks(call):
        return ins[0].layout
    over_blocks = name == "relax.nn.layer_norm" and sorted(int(a) % 5 for a in call.attrs.axes) == [1, 4]
    if category == NORM and over_blocks and ins:
        return ins[0].layout  # over the channels of a blocked tensor: the same layout out
    return None


def _keeps_blocks(call: relax.Call) -> bool:
    """A reduction over spatial axes only (2, 3) that keeps its dims: NCHW{b}c in, out."""
    axis = getattr(call.attrs, "axis", None)
    keep = bool(getattr(call.attrs, "keepdims", False))
    if not keep or axis is None:
        return False
    # argmax/argmin name one axis (an int), sum/mean/max a list of them
    axes = [axis] if isinstance(axis, (int, tvm.tirx.IntImm)) else list(axis)
    return sorted(int(a) % 5 for a in axes) == [2, 3]


__all__ = ["block_of", "blocked", "blocking_map", "output_layout", "transform_layouts", "unblocking_map"]
