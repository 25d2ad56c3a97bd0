"""Describe a Relax op call as an Emit: kind, attrs, interface, contract template.

The template holds what the kind guarantees before any propagation: effects (inputs
Read, outputs Write; opaque ReadWrite everywhere), each port's shape as its Relax type
gives it, the output's own numeric semantics, and ``requires`` the rank it was typed
with. ``PropagateContracts`` refines it with strides, alias and numeric facts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from ..contract import ContractFacts, EmitContract, PortFacts
from ..emit import Emit, Interface, Port
from ..lattice import (
    Effect,
    MathTag,
    NumericFact,
    ShapeFact,
)
from ..lattice.shape import Dim, mul_dims
from ..tvm_values import to_python
from .registry import BROADCAST, ELEMENTWISE, OPAQUE_RULE, KindRule, rule_for

READ, WRITE, READWRITE = Effect("Read"), Effect("Write"), Effect("ReadWrite")

# Ops whose registered argument list names fewer arguments than calls pass.
_ARG_NAMES = {"relax.strided_slice": ["x", "axes", "begin", "end", "strides"]}


def arg_names(op: relax.Expr) -> list[str]:
    if not isinstance(op, tvm.ir.Op):
        return []
    return _ARG_NAMES.get(op.name) or [a.name for a in op.arguments]


def is_tensor(expr: relax.Expr) -> bool:
    return isinstance(getattr(expr, "ty", None), relax.TensorType)


def is_tensor_tuple(expr: relax.Expr) -> bool:
    return isinstance(expr, relax.Tuple) and len(expr.fields) > 0 and all(is_tensor(f) for f in expr.fields)


def dim_value(d: tvm.ir.Expr | int) -> Dim:
    """An extent as a fact dim: an int, or the expression as text; a product of vars and
    constants in ``mul_dims``' canonical form (``batch * seq * 2`` is ``2*batch*seq``), the
    form the shape lattice computes strides in, so equal products compare equal."""
    if isinstance(d, int):
        return d
    if isinstance(d, tvm.tirx.IntImm):
        return int(d.value)
    factors = _product_factors(d)
    if factors is not None:
        out: Dim = 1
        for f in factors:
            out = mul_dims(out, f)
        return out
    return re.sub(r"T\.int\d+\((-?\d+)\)", r"\1", str(d)).replace(" ", "")


def _product_factors(d: tvm.ir.Expr) -> list[str | int] | None:
    """The var names and ints whose product ``d`` is, or None when it is not a product."""
    if isinstance(d, tvm.tirx.IntImm):
        return [int(d.value)]
    if isinstance(d, tvm.tirx.Var):
        return [d.name]
    if isinstance(d, tvm.tirx.Mul):
        a, b = _product_factors(d.a), _product_factors(d.b)
        return None if a is None or b is None else a + b
    return None


_TYPE_SHAPES: dict[int, ShapeFact] = {}


def type_shape(ty: relax.Type | None) -> ShapeFact:
    """The shape fact a Relax tensor type proves: dims if known, else rank, else ⊤."""
    if not isinstance(ty, relax.TensorType):
        return ShapeFact.top()
    key = tvm_ffi.structural_hash(ty)  # free symbolic vars hash by identity: no false sharing
    fact = _TYPE_SHAPES.get(key)
    if fact is None:
        if len(_TYPE_SHAPES) > 100_000:
            _TYPE_SHAPES.clear()
        fact = _TYPE_SHAPES[key] = _type_shape(ty)
    return fact


def _type_shape(ty: relax.TensorType) -> ShapeFact:
    shape = ty.shape
    if shape is not None and isinstance(shape, relax.ShapeExpr):
        return ShapeFact(tuple(dim_value(d) for d in shape.values))
    return ShapeFact.top() if ty.ndim < 0 else ShapeFact.rank(ty.ndim)


def plain_value(value: Any) -> Any:
    """An attr or non-tensor argument as str/int/float/bool/list/dict (None when absent)."""
    return to_python(value, _attr_value)


def _attr_value(value: Any) -> Any:
    """What ``to_python`` leaves to its caller: an unset attr (None) stays None, an Attrs
    object is its dict, a boxed value its content, and anything else (a symbolic dim
    such as ``n * 2``) its printed form without spaces."""
    if value is None:
        return None
    if hasattr(value, "fields") and not hasattr(value, "ty"):  # an Attrs object
        return attrs_dict(value)
    if hasattr(value, "value") and not hasattr(value, "ty"):
        return plain_value(value.value)
    return str(value).replace(" ", "")


def attr_names(attrs: tvm.ir.Attrs | None) -> list[str]:
    """The fields an op's Attrs object declares (set or not)."""
    if isinstance(attrs, tvm.ir.DictAttrs):
        return [str(k) for k in attrs.keys()]  # noqa: SIM118 - a DictAttrs iterates by keys()
    info = getattr(type(attrs), "__tvm_ffi_type_info__", None) if attrs is not None else None
    return [f.name for f in info.fields] if info is not None else []


def attrs_dict(attrs: tvm.ir.Attrs | None) -> dict[str, Any]:
    out = {}
    for name in attr_names(attrs):
        v = plain_value(getattr(attrs, name))
        if v is not None:
            out[name] = v
    return out


def _names_a_dimension(attr: str) -> bool:
    return attr.endswith(("axis", "axes")) or "layout" in attr


def is_pointwise(call: relax.Expr) -> bool:
    """Whether ``call`` computes each output element from the input element at the same
    index alone, whatever shape the input has: what lets a rewrite apply the op to the
    input in another shape (before a reshape) and get the same values.

    Proven only for an elementwise or broadcast kind that returns one tensor (not
    dropout's pair) and carries no attribute naming an axis or a layout: such an
    attribute ties the op to its input's shape (``prelu(x, alpha, axis=1)`` applies
    ``alpha`` along dimension 1, which a reshape moves or removes).
    """
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return False
    if rule_for(call.op.name).category not in (ELEMENTWISE, BROADCAST) or not is_tensor(call):
        return False
    return not any(_names_a_dimension(a) for a in attr_names(call.attrs))


@dataclass(frozen=True)
class CallSignature:
    """How a call splits into Emit ports (tensors) and inline arguments."""

    rule: KindRule
    tensor_args: tuple  # the Relax exprs passed as ports, flattened
    port_names: tuple[str, ...]


def flat_tensor_args(call: relax.Call) -> list:
    """The call's tensor arguments in port order, tuples of tensors flattened."""
    out = []
    for arg in call.args:
        if is_tensor(arg):
            out.append(arg)
        elif is_tensor_tuple(arg):
            out.extend(arg.fields)
    return out


def split_call(call: relax.Call) -> CallSignature:
    op = call.op
    names = arg_names(op)
    rule = rule_for(op.name) if isinstance(op, tvm.ir.Op) else OPAQUE_RULE
    tensors, ports = [], []
    for i, arg in enumerate(call.args):
        base = names[i] if i < len(names) else f"in{i}"
        if is_tensor(arg):
            tensors.append(arg)
            ports.append(base)
        elif is_tensor_tuple(arg):
            for j, field in enumerate(arg.fields):
                tensors.append(field)
                ports.append(f"{base}.{j}")
    return CallSignature(rule, tuple(tensors), _unique(ports))


def _unique(names: list[str]) -> tuple[str, ...]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 else f"{n}_{k}")
    return tuple(out)


def output_types(ty: relax.Type) -> list[tuple[str, relax.Type]]:
    if isinstance(ty, relax.TupleType) or type(ty).__name__ == "TupleType":
        return [(f"out.{i}", f) for i, f in enumerate(ty.fields)]
    return [("out", ty)]


def _port(name: str, ty: relax.Type) -> Port:
    dtype = str(getattr(ty, "dtype", "")) or "unknown"
    return Port(name, dtype, int(getattr(ty, "ndim", -1)))


def own_numeric(rule: KindRule, attrs: dict, dtype: str) -> NumericFact:
    """The numeric semantics of the Emit's own computation of one output: the exact fact
    of its accumulation dtype, with the kind's math tag (``approx:*`` for approximations)."""
    if rule.is_opaque:
        return NumericFact.top()
    acc = attrs.get("out_dtype") or dtype
    return replace(NumericFact.exact(acc), math=MathTag(rule.math))


def describe_call(call: relax.Call, sig: CallSignature | None = None) -> Emit:
    """The Emit (with its contract template) for one Relax op call."""
    sig = sig or split_call(call)
    rule = sig.rule
    op_name = call.op.name if isinstance(call.op, tvm.ir.Op) else type(call.op).__name__
    attrs = attrs_dict(call.attrs)
    names = arg_names(call.op)
    for i, arg in enumerate(call.args):  # non-tensor arguments become attrs
        if not (is_tensor(arg) or is_tensor_tuple(arg)):
            v = plain_value(arg)
            if v is not None:
                attrs[names[i] if i < len(names) else f"arg{i}"] = v
    inputs = tuple(_port(n, a.ty) for n, a in zip(sig.port_names, sig.tensor_args))
    outs = output_types(call.ty)
    outputs = tuple(_port(n, t) for n, t in outs)
    in_effect, out_effect = (READWRITE, READWRITE) if rule.has_effects else (READ, WRITE)
    provides = {}
    requires = {}
    for p, a in zip(inputs, sig.tensor_args):
        provides[p.name] = PortFacts(effect=in_effect, shape=type_shape(a.ty))
        if p.ndim >= 0 and not rule.is_opaque:
            requires[p.name] = PortFacts(shape=ShapeFact.rank(p.ndim))
    for p, (_, t) in zip(outputs, outs):
        provides[p.name] = PortFacts(effect=out_effect, shape=type_shape(t),
                                     numeric=own_numeric(rule, attrs, p.dtype))
    contract = EmitContract(ContractFacts.of(requires), ContractFacts.of(provides))
    return Emit(rule.kind, attrs, Interface(inputs, outputs), contract, math=rule.math, op=op_name)
