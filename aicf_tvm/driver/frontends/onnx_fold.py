"""Fold an ONNX graph's shape computations to constants before TVM's ONNX frontend sees it.

Exporters compute pads, reshape targets and mask shapes at run time from ``Shape`` nodes
(``Shape -> Gather -> Concat -> Pad``). TVM's ONNX frontend needs them constant: it
stops on ``Pad`` with computed pads, on ``Reshape`` of a tensor whose shape it lost, on
``ConstantOfShape`` of a computed shape. Once the input shapes are known (static, or
pinned with ``shapes=``) those values are constants, so:

1. ONNX's own shape inference (``infer_shapes(data_prop=True)``, which also propagates the
   values of small shape tensors into the shapes downstream) gives static shapes;
2. a ``Shape``/``Size`` of a statically shaped tensor becomes a constant, and so does any
   node of ``FOLDABLE`` whose inputs are all constants, evaluated by ONNX's reference
   evaluator (``onnx.reference``) at the model's opset;
3. repeat until nothing folds (a folded reshape target gives its output a static shape,
   whose ``Shape`` then folds), then drop what no one reads.

Weights (initializers above ``MAX_FOLDED_ELEMENTS`` elements) are left out of the copy
that inference and folding work on (their name, dims and type stay: all that shape
inference reads of them), since ``infer_shapes`` serializes and parses the whole model at
each round; a fold that reads one (a row gathered from a table) converts it from the
given model, and the folded model gets them back at the end.

Sound because every folded value is what the node computes for every run with these
input shapes: shapes of static tensors, and ops that are deterministic and exact on their
constant inputs (no float transcendental functions: ONNX Runtime and the reference
evaluator need not round them alike). Named dynamic dims stay dynamic: a ``Shape`` of a
tensor with a symbolic dim does not fold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

# Deterministic ops, exact on their inputs (a float result is one correctly rounded
# operation), that shape computations are made of.
FOLDABLE = frozenset(["Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Concat", "ConstantOfShape", "Div", "Equal",
                      "Expand", "Flatten", "Floor", "Gather", "GatherElements", "Greater", "GreaterOrEqual", "Identity",
                      "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Not", "Or", "Range", "ReduceMax",
                      "ReduceMin", "Reshape", "Slice", "Sqrt", "Squeeze", "Sub", "Tile", "Transpose", "Unsqueeze",
                      "Where", "Xor", "CumSum", "ReduceSum", "ReduceProd", "NonZero"])

# Sums and products round once per step, in an order each runtime picks: folded only
# on integers (and bools), where every order gives the same value.
INTEGER_ONLY = frozenset({"CumSum", "ReduceSum", "ReduceProd"})

# A folded value becomes an initializer: shape tensors are tiny; a bigger constant
# expression is left to Relax's FoldConstant, which does not copy it into the protobuf.
MAX_FOLDED_ELEMENTS = 1 << 16

# A bound, not a budget: a model whose every layer reshapes to a shape computed from the
# one before folds a layer per round (ModernBERT's 22 layers: 23 rounds, 2 s; it stopped at
# layer 8, and TVM's Slice lost the shapes after it)
MAX_ROUNDS = 256


def fold_shapes(model: onnx.ModelProto, prepare: Callable[[onnx.ModelProto], None] | None = None,
                check: Callable[[onnx.ModelProto], None] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` with its shape subgraphs folded (see the module docstring);
    ``prepare`` edits the copy first (the input shapes ``from_onnx`` pins); ``check`` sees
    the folded graph before the weights' data comes back (``weightless``)."""
    folded, weights = _without_weights(model)
    if prepare is not None:
        prepare(folded)
    opsets = {o.domain or "": o.version for o in folded.opset_import}
    for _ in range(MAX_ROUNDS):
        folded = _infer(folded)
        if not _fold_once(folded.graph, opsets, weights):
            break
    _drop_dead(folded.graph)
    if check is not None:
        check(weightless(folded, weights))
    for init in folded.graph.initializer:
        if init.name in weights:
            init.CopyFrom(weights[init.name])
    return folded


_DATA_FIELDS = frozenset({"raw_data", "float_data", "double_data", "int32_data", "int64_data", "uint64_data",
                          "string_data"})


def _copy_fields(src, dst, skip: frozenset | set = frozenset()) -> None:
    """Copy the set fields of protobuf message ``src`` into ``dst``, but those in ``skip``."""
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if (field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED):
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _without_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """A copy of ``model`` whose weights (initializers above ``MAX_FOLDED_ELEMENTS``
    elements) keep their name, dims and type but not their data (never copied), and those
    weights of ``model`` by name."""
    import onnx

    light = onnx.ModelProto()
    _copy_fields(model, light, {"graph"})
    _copy_fields(model.graph, light.graph, {"initializer"})
    weights = {}
    for init in model.graph.initializer:
        if init.data_location != onnx.TensorProto.EXTERNAL and math.prod(init.dims) > MAX_FOLDED_ELEMENTS:
            weights[init.name] = init
            _copy_fields(init, light.graph.initializer.add(), _DATA_FIELDS)
        else:
            light.graph.initializer.add().CopyFrom(init)
    return light, weights


def weightless(model: onnx.ModelProto, weights: Mapping[str, onnx.TensorProto]) -> onnx.ModelProto:
    """A copy of ``model`` (from ``_without_weights``) whose ``weights`` are empty tensors:
    a graph ``onnx.checker.check_model`` checks like the whole model (nodes, order,
    attributes, opsets) without serializing the weights' bytes, 1.2 s of BERT-base's
    import; only each weight's own size check is left out."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for init in copy.graph.initializer:
        if init.name in weights:
            del init.dims[:]
            init.dims.append(0)
    return copy


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - inference refuses some models; fold without it
        return model


def _static_shapes(graph: onnx.GraphProto) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        tensor = info.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[info.name] = [d.dim_value for d in tensor.shape.dim]
    for init in graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


class _Values(dict):
    """Known values by name; a weight (not in the folded copy) converted when first read."""

    def __init__(self, weights: dict[str, onnx.TensorProto]) -> None:
        super().__init__()
        self.weights = weights

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in self.weights

    def __missing__(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        if name not in self.weights:
            raise KeyError(name)
        value = self[name] = numpy_helper.to_array(self.weights[name])
        return value


def _constants(graph: onnx.GraphProto, opsets: dict[str, int], weights: dict[str, onnx.TensorProto]) -> _Values:
    from onnx import numpy_helper

    values = _Values(weights)
    values.update((init.name, numpy_helper.to_array(init)) for init in graph.initializer if init.name not in weights)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            try:
                values[node.output[0]] = _evaluate(node, {}, opsets)[0]
            except Exception:  # noqa: BLE001 - e.g. a sparse constant: left as it is
                pass
    return values


def _shape_value(node: onnx.NodeProto, shapes: dict[str, list[int]]) -> np.ndarray | None:
    """The value of a ``Shape``/``Size`` node whose input shape is static."""
    dims = shapes.get(node.input[0])
    if dims is None:
        return None
    if node.op_type == "Size":
        return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(dims))
    return np.array(dims[start:end] if "end" in attrs else dims[start:], dtype=np.int64)


def _evaluate(node: onnx.NodeProto, inputs: dict[str, np.ndarray], opsets: dict[str, int]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    feeds = {name: inputs[name] for name in node.input if name}
    return list(ReferenceEvaluator(node, opsets=opsets).run(None, feeds))


def _is_foldable(node: onnx.NodeProto, known: dict[str, np.ndarray], outputs: set[str]) -> bool:
    if node.domain not in ("", "ai.onnx") or any(o in outputs for o in node.output):
        return False
    if node.op_type not in FOLDABLE or any(name and name not in known for name in node.input):
        return False
    return node.op_type not in INTEGER_ONLY or known[node.input[0]].dtype.kind in "biu"


def _fold_once(graph: onnx.GraphProto, opsets: dict[str, int], weights: dict[str, onnx.TensorProto]) -> bool:
    """One pass in graph order (``weights``: the data of the initializers left without
    it); True when a node was replaced by initializers."""
    from onnx import numpy_helper

    known, shapes = _constants(graph, opsets, weights), _static_shapes(graph)
    outputs = {o.name for o in graph.output}
    keep, changed = [], False
    for node in graph.node:
        values = None
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx") and node.output[0] not in outputs:
            value = _shape_value(node, shapes)
            values = None if value is None else [value]
        elif _is_foldable(node, known, outputs):
            try:
                values = _evaluate(node, known, opsets)
            except Exception:  # noqa: BLE001 - the evaluator refuses it: keep the node
                values = None
        if values is None or any(np.asarray(v).size > MAX_FOLDED_ELEMENTS for v in values):
            keep.append(node)
            continue
        for name, value in zip(node.output, values):
            if name:
                value = np.asarray(value)
                known[name] = value
                graph.initializer.append(numpy_helper.from_array(value, name))
        changed = True
    del graph.node[:]
    graph.node.extend(keep)
    if changed:  # a folded value's inferred type goes: its initializer has the true shape, and
        # a stale entry (an unknown dim) would pass on to every value the next inference types
        folded = {init.name for init in graph.initializer}
        stale = [info for info in graph.value_info if info.name in folded]
        for info in stale:
            graph.value_info.remove(info)
    return changed


def _used_names(graph: onnx.GraphProto) -> set[str]:
    """Every name a node reads, subgraph bodies (If/Loop branches) included."""
    used: set[str] = set()
    for node in graph.node:
        used.update(node.input)
        for attr in node.attribute:
            for sub in [attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs:
                used |= _used_names(sub)
    return used


def _drop_dead(graph: onnx.GraphProto) -> None:
    """Remove nodes and initializers no output depends on (walking back from outputs)."""
    while True:
        live = _used_names(graph) | {o.name for o in graph.output}
        alive = [n for n in graph.node if any(o in live for o in n.output)]
        if len(alive) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(alive)
    # an initializer that is also a graph input stays: without it the input becomes required
    live = _used_names(graph) | {o.name for o in graph.output} | {i.name for i in graph.input}
    inits = [i for i in graph.initializer if i.name in live]
    del graph.initializer[:]
    graph.initializer.extend(inits)
