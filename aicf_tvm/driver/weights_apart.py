"""The weights apart from the executable: ``lift_weights``.

A library that keeps its weights in the VM executable's constant section copies them at
every step: TVM serializes the section (a copy), the assembler and the linker copy it
again, and a load deserializes every weight into fresh memory (BERT-base: 440 MB, 5-6 s
of its export, most of its 1 s load). Lifted, every entry function of the module takes
the weights as one more parameter, last, a tuple: the executable is the kernels and the
bytecode, and ``runtime.deploy.export`` writes the weights' bytes after the library's
code, where ``runtime.mapped_weights.map_weights`` maps them (no copy) for every call to take.

Runs on the module the VM's code generator gets (the backend's lowering done: no pass
after it folds or reads a constant's value). A constant of at least ``MIN_BYTES``
bytes is a weight; each function binds ``weights[i]`` once, at its top, for each weight
it reads, in place of the constant. Smaller constants (scalars, shapes) stay.

Sound: the parameter holds the very tensors the constants held (the same objects in
this process, their bytes in a library), and no kernel writes a constant (the Emits'
weight ports are read-only). Where a Relax function that is not an entry holds a weight
(no caller passes the parameter on to it), nothing is lifted (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .merge import constants_of

MIN_BYTES = 4096
PARAM = "aicf_weights"


@dataclass
class WeightsApart:
    """An executable whose entry functions take ``weights`` as their last argument (a
    tuple, ``lift_weights``), built from the same kernels as the one it is attached to."""

    executable: Any
    weights: list[tvm.runtime.Tensor]


# what numpy takes through DLPack, which the export writes and the load maps: bfloat16,
# float8 and sub-byte types stay inside the executable
MAPPABLE_DTYPES = frozenset(["bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                             "uint16", "uint32", "uint64"])


def is_weight(const: tvm.ir.expr.GenericConst) -> bool:
    """A CPU tensor of at least ``MIN_BYTES`` bytes of a ``MAPPABLE_DTYPES`` dtype."""
    value = const.value
    if (not isinstance(value, tvm.runtime.Tensor) or value.device.dlpack_device_type() != 1
            or str(value.dtype) not in MAPPABLE_DTYPES):
        return False
    return int(np.prod(value.shape, dtype=np.int64)) * np.dtype(str(value.dtype)).itemsize >= MIN_BYTES


def _is_entry(func: relax.Function) -> bool:
    return func.attrs is not None and "global_symbol" in func.attrs


@mutator
class ReplaceWeights(PyExprMutator):
    """Each weight (by tensor) replaced by the variable ``bound`` gives it."""

    def __init__(self, bound: dict[Any, relax.Var]) -> None:
        super().__init__()
        self.bound = bound

    def visit_generic_const_(self, op: tvm.ir.expr.GenericConst) -> relax.Expr:
        return self.bound.get(op.value, op)


def lift_weights(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[tvm.runtime.Tensor]] | None:
    """``mod`` with its weights lifted to a last tuple parameter of every entry function,
    and the weights in the tuple's order (module docstring); None when there is no
    weight, or a function that is not an entry holds one."""
    funcs = {gv: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
    found = {gv: [c for c in constants_of(f) if is_weight(c)] for gv, f in funcs.items()}
    if not any(found.values()) or any(consts and not _is_entry(funcs[gv]) for gv, consts in found.items()):
        return None
    position: dict[Any, int] = {}  # by tensor: constants of one tensor are one weight
    weights: list[tvm.runtime.Tensor] = []
    for consts in found.values():
        for const in consts:
            if const.value not in position:
                position[const.value] = len(weights)
                weights.append(const.value)
    tuple_type = relax.TupleType([relax.TensorType(w.shape, str(w.dtype)) for w in weights])
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in funcs.items():
        if not _is_entry(func):
            continue
        param = relax.Var(PARAM, tuple_type)
        bound: dict[Any, relax.Var] = {}
        bindings = []
        for const in found[gv]:
            if const.value not in bound:
                at = position[const.value]
                var = bound[const.value] = relax.Var(f"weight{at}", relax.TensorType(const.value.shape,
                                                                                    str(const.value.dtype)))
                bindings.append(relax.VarBinding(var, relax.TupleGetItem(param, at)))
        body = ReplaceWeights(bound).visit_expr(func.body)
        body = relax.SeqExpr([relax.BindingBlock(bindings), *body.blocks], body.body)
        out[gv] = relax.Function([*func.params, param], body, func.ret_ty, func.is_pure, func.attrs, func.span)
    return out, weights


__all__ = ["MIN_BYTES", "PARAM", "ReplaceWeights", "WeightsApart", "is_weight", "lift_weights"]
