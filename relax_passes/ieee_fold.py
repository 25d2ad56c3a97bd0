"""FoldConstant with IEEE float arithmetic: rank-0 float constants folded as buffers.

Relax's legalization of a binary op (``legalize_ops.binary``) turns a rank-0 constant
operand into a TIR immediate, and TVM's arithmetic folds immediates as if floats were
reals: ``x + 0.0`` becomes ``x`` (a -0.0 stays -0.0, where IEEE gives +0.0), ``x * 0.0``
becomes 0.0 (NaN and inf times zero are NaN). ``FoldConstant``, which legalizes the ops it
folds, so computed ``add(const([-0.0, 1.0]), const(0.0))`` as ``[-0.0, 1.0]``.

``FoldConstantIEEE`` runs ``FoldConstant`` with a rank-0 float constant kept a Relax
operand there, so the folded kernel reads it from a 0-d buffer and computes what IEEE
arithmetic gives, as our kernels do at run time (``lower_emits.bind_scalar_ports`` binds
an immediate only where no such fold applies). Integer constants, and the Python values
other legalizations take (``full``'s fill, ``arange``'s bounds), are converted as before.
``scalars_as_buffers`` is the same for any legalization run inside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import tvm
from tvm import relax
from tvm.relax.transform.legalize_ops import binary

from .narrow_constants import keep_narrow


def _keep_float_scalars(convert: Any) -> Any:
    def converted(expr: Any, python_native: bool = False) -> Any:
        if (not python_native and isinstance(expr, tvm.ir.Constant) and isinstance(expr.ty, relax.TensorType)
                and expr.ty.ndim == 0 and str(expr.ty.dtype).startswith(("float", "bfloat"))):
            return expr
        return convert(expr, python_native)

    return converted


@contextmanager
def scalars_as_buffers() -> Iterator[None]:
    """Binary ops legalized inside keep rank-0 float constants as operands (module docstring)."""
    saved = binary._try_convert_to_scalar_const
    binary._try_convert_to_scalar_const = _keep_float_scalars(saved)
    try:
        yield
    finally:
        binary._try_convert_to_scalar_const = saved


@tvm.transform.module_pass(opt_level=0, name="FoldConstantIEEE")
class FoldConstantIEEE:
    """``relax.transform.FoldConstant`` with IEEE float arithmetic (module docstring)."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with scalars_as_buffers():
            return keep_narrow(relax.transform.FoldConstant(), mod)


__all__ = ["FoldConstantIEEE", "scalars_as_buffers"]
