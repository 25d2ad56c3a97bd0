"""TVM values as plain Python: the one conversion every reader of TVM attrs uses.

Emit annotations decode through it (``emit.plain``), op attrs and non-tensor arguments
become Emit attrs (``kinds.describe``), kernel signatures are hashed from it
(``schedules.select``).  The readers differ only in what becomes of a value with no
plain form (None included), so that is the ``other`` argument: a string by default,
an ``EncodingError`` for the annotation decoder.

TVM is imported on the first call, not with this module: the core imports without it,
and a runtime-only process (``aicf_tvm.load``) never calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tvm import relax


def to_python(value: Any, other: Callable[[Any], Any] = str) -> Any:
    """``value`` as bool/int/float/str, lists and str-keyed dicts of them.

    Immediates (IntImm, bool IntImm, FloatImm, StringImm) become their Python value,
    Map a dict, Array/list/tuple a list, a Relax ShapeExpr or Tuple the list of its
    elements; anything else, None included, is ``other(value)``.
    """
    import tvm
    import tvm_ffi

    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, tvm.tirx.IntImm):
        return bool(value.value) if str(value.ty) == "bool" else int(value.value)
    if isinstance(value, tvm.tirx.FloatImm):
        return float(value.value)
    if isinstance(value, tvm.ir.StringImm):
        return str(value.value)
    if isinstance(value, (dict, tvm_ffi.Map)):
        return {str(k): to_python(v, other) for k, v in value.items()}
    if isinstance(value, (list, tuple, tvm_ffi.Array)):
        return [to_python(v, other) for v in value]
    from tvm import relax

    if isinstance(value, relax.ShapeExpr):
        return [to_python(v, other) for v in value.values]
    if isinstance(value, relax.Tuple):
        return [to_python(v, other) for v in value.fields]
    return other(value)


def static_shape(ty: relax.Type | None) -> tuple[int, ...] | None:
    """The dims of a Relax type as ints; None when the shape is unknown or any dim symbolic."""
    import tvm
    from tvm import relax

    shape = getattr(ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return None
    dims = []
    for d in shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            return None
        dims.append(int(d.value))
    return tuple(dims)
