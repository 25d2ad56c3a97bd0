"""Stride transfer rules of view Emits (docs/design.md §3 C).

Each maps the input's stride facts to the output's, returning ``None`` when a needed
input stride is unknown, so the rules are monotone: a stronger input fact never
gives a weaker output fact. The results are true strides: a permutation or an
inner-axis slice is non-contiguous, a reshape of a contiguous tensor is contiguous.
"""

from __future__ import annotations

from ..lattice import ShapeFact, mul_dims, row_major


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def reshape(call, ins: list[ShapeFact], out_dims: tuple):
    src = ins[0]
    return row_major(out_dims) if src.is_contiguous() else None


def permute_dims(call, ins: list[ShapeFact], out_dims: tuple):
    src = ins[0]
    if src.strides is None:
        return None
    axes = call.attrs.axes
    perm = list(range(len(src.strides)))[::-1] if axes is None else _ints(axes)
    return tuple(src.strides[a] for a in perm)


def squeeze(call, ins: list[ShapeFact], out_dims: tuple):
    src = ins[0]
    if src.strides is None or src.dims is None:
        return None
    axes = call.attrs.axis
    nd = len(src.dims)
    drop = {a % nd for a in _ints(axes)} if axes is not None else {i for i, d in enumerate(src.dims) if d == 1}
    return tuple(s for i, s in enumerate(src.strides) if i not in drop)


def expand_dims(call, ins: list[ShapeFact], out_dims: tuple):
    src = ins[0]
    if src.strides is None:
        return None
    nd = len(out_dims)
    new = {a % nd for a in _ints(call.attrs.axis)}
    it = iter(src.strides)
    inserted = object()  # not None: None is an input stride that is not known
    strides = [inserted if i in new else next(it) for i in range(nd)]
    for i in reversed(range(nd)):  # an inserted extent-1 axis takes the stride that keeps layout
        if strides[i] is inserted:
            strides[i] = mul_dims(strides[i + 1], out_dims[i + 1]) if i + 1 < nd else 1
    return tuple(strides)


def strided_slice(call, ins: list[ShapeFact], out_dims: tuple):
    src = ins[0]
    if src.strides is None:
        return None
    axes, steps = call.args[1], call.args[4] if len(call.args) > 4 else None
    strides = list(src.strides)
    nd = len(strides)
    for i, axis in enumerate(axes):
        step = 1 if steps is None else steps[i]
        step_v = getattr(step, "value", step)
        step_v = getattr(step_v, "value", step_v)
        if not isinstance(step_v, int):
            return None
        a = int(getattr(axis, "value", axis)) % nd
        strides[a] = mul_dims(strides[a], step_v)
    return tuple(strides)


def broadcast_to(call, ins: list[ShapeFact], out_dims: tuple):
    src = ins[0]
    if src.strides is None or src.dims is None:
        return None
    lead = len(out_dims) - len(src.dims)
    out = [0] * lead
    for d_in, s_in, d_out in zip(src.dims, src.strides, out_dims[lead:]):
        out.append(0 if (d_in == 1 and d_out != 1) else s_in)
    return tuple(out)
