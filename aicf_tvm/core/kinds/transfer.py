"""Transfer of facts through one Emit: input facts -> output facts.

Monotone by construction: output shapes come from the Relax type (constant) met with
stride rules that return ``None`` (unknown) when an input stride is unknown; output
numerics join the Emit's own semantics with the inputs' math tag and determinism
(an approximate or run-dependent input makes the output so); ABI facts follow from
the shape. Stronger inputs therefore never yield weaker outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..contract import PortFacts
from ..emit import Emit
from ..lattice import ABIFact, Alignment, Determinism, Flag, NumericFact, ShapeFact
from .describe import output_types, type_shape
from .layouts import output_layout
from .registry import rule_for

if TYPE_CHECKING:
    from tvm import relax

# TVM's runtime allocates every tensor on a 64-byte boundary (kAllocAlignment).
ALLOC_ALIGN = Alignment(64)


def fresh_shape(ty: relax.Type | None) -> ShapeFact:
    """A newly allocated result: row-major over the dims its type gives."""
    fact = type_shape(ty)
    return fact if fact.dims is None else ShapeFact.contiguous(fact.dims)


def abi_of(shape: ShapeFact, alignment: Alignment) -> ABIFact:
    return ABIFact(alignment, Flag.of(shape.ndim == 0), Flag.of(shape.is_contiguous()))


_INTERNED: dict = {}


def value_facts(shape: ShapeFact, numeric: NumericFact, alignment: Alignment = ALLOC_ALIGN) -> PortFacts:
    """The facts of a value, interned: equal facts are one object (cheap to compare and
    to key caches by identity)."""
    key = (shape, numeric, alignment)
    facts = _INTERNED.get(key)
    if facts is None:
        if len(_INTERNED) > 200_000:
            _INTERNED.clear()
        facts = _INTERNED[key] = PortFacts(shape=shape, numeric=numeric, abi=abi_of(shape, alignment))
    return facts


def transfer(emit: Emit, body_call: relax.Call | None, ins: Sequence[PortFacts],
             out_ty: relax.Type) -> list[PortFacts]:
    """Facts of each output of ``emit`` given its inputs' facts."""
    rule = rule_for(emit.op)
    math, det = None, Determinism.bottom()
    for f in ins:
        math = f.numeric.math if math is None else math.join(f.numeric.math)
        det = det.join(f.numeric.determinism)
    outs = []
    for port, (_, ty) in zip(emit.interface.outputs, output_types(out_ty)):
        own = emit.contract.provides.port(port.name).numeric
        numeric = NumericFact(own.math if math is None else own.math.join(math),
                              own.accumulation, own.determinism.join(det), own.rounding)
        if rule.strides is not None and body_call is not None and ins:
            base = type_shape(ty)
            strides = None
            if base.dims is not None:
                strides = rule.strides(body_call, [f.shape for f in ins], base.dims)
            shape = ShapeFact(base.dims, strides) if base.dims is not None else base
        else:
            shape = fresh_shape(ty)
        # the layout: what the op states or carries; a fused Emit states it in its contract
        layout = output_layout(body_call, [f.shape for f in ins]) if len(emit.interface.outputs) == 1 else None
        shape = shape.with_layout(layout or emit.contract.provides.port(port.name).shape.layout)
        outs.append(value_facts(shape, numeric))
    return outs
