"""What every model test shares: models whose outputs depend on their inputs, operands that
differ from one another, and the check that a comparison can see a wrong result at all.

A comparison against a reference proves nothing when the reference gives the same output
for every input (the onnx wheel's light models build every weight with ``ConstantOfShape``
0.02: any two inputs give the same softmax), or when operands that should differ are the
same array (``default_rng(0)`` re-seeded per operand gives q == k == v).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

# Ops a weight passes through unchanged on its way to the op that uses it.
_PASS_THROUGH = {"Unsqueeze", "Reshape", "Identity", "Cast"}
# Ops with f(c*x) = c*f(x) for c > 0: scaling the layer before them scales what they give.
_HOMOGENEOUS = {"Relu", "Dropout", "Reshape", "Flatten", "MaxPool", "AveragePool", "GlobalAveragePool"}


class Operands:
    """Seeded random operands for one test: every call draws new values from one generator,
    so two operands of the same shape differ (and a test's values do not depend on others)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, *shape: int, dtype: str = "float32") -> np.ndarray:
        return self.rng.standard_normal(shape).astype(dtype)


def assert_input_sensitive(first: np.ndarray, second: np.ndarray, *, rtol: float, atol: float,
                           what: str = "the reference") -> None:
    """Two different inputs must give outputs that the comparison's own tolerance tells
    apart: otherwise a result that ignores its input would pass."""
    first, second = np.asarray(first, np.float64), np.asarray(second, np.float64)
    assert np.isfinite(first).all() and np.isfinite(second).all(), f"{what} gives non-finite outputs"
    assert not np.allclose(first, second, rtol=rtol, atol=atol), (
        f"{what} gives the same output for two different inputs (max |a-b| = "
        f"{np.abs(first - second).max():.3g}, within rtol={rtol}, atol={atol}): "
        "the comparison cannot see a wrong result")


def assert_matches_reference(ours: Callable[..., np.ndarray], reference: Callable[..., np.ndarray],
                             input_sets: Sequence[Sequence[np.ndarray]], *, rtol: float, atol: float) -> None:
    """``ours`` equals ``reference`` on each input set, after checking that the reference's
    outputs for the first two sets differ (so the comparison is not vacuous)."""
    assert len(input_sets) >= 2, "need two different input sets"
    wants = [np.asarray(reference(*args)) for args in input_sets]
    assert_input_sensitive(wants[0], wants[1], rtol=rtol, atol=atol)
    for k, (args, want) in enumerate(zip(input_sets, wants)):
        np.testing.assert_allclose(np.asarray(ours(*args)), want, rtol=rtol, atol=atol,
                                   err_msg=f"input set {k}")


def ort_session(model: onnx.ModelProto | str | bytes) -> Any:
    """An ONNX Runtime CPU session on 2 threads, quiet about the light models' old IR."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 2, 3
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def ort_function(model: onnx.ModelProto | str | bytes) -> Callable[..., np.ndarray]:
    """``f(*inputs) -> first output`` of ``model`` on ONNX Runtime (inputs in graph order)."""
    session = ort_session(model)
    names = [i.name for i in session.get_inputs()]

    def run(*args: np.ndarray) -> np.ndarray:
        return session.run(None, dict(zip(names, args, strict=True)))[0]

    return run


def torch_function(module: Any) -> Callable[..., np.ndarray]:
    """``f(*numpy inputs) -> numpy output`` of a PyTorch module in eager mode."""
    import torch

    def run(*args: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(*(torch.from_numpy(a) for a in args)).numpy()

    return run


def _uses(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for k, name in enumerate(node.input):
            uses[name].append((node, k))
    return uses


def _role(name: str, uses: dict) -> tuple[str, int]:
    """(op type, input index) of the op that consumes weight ``name``, through reshapes."""
    for _ in range(8):
        consumers = uses.get(name, [])
        if len(consumers) != 1:
            break
        node, k = consumers[0]
        if node.op_type not in _PASS_THROUGH or k != 0:
            return node.op_type, k
        name = node.output[0]
    return "", -1


def _random_weight(rng: np.random.Generator, shape: tuple[int, ...], role: tuple[str, int]) -> np.ndarray:
    """A value of the scale a trained network has in that position: He-initialized conv and
    dense weights (``[out, in...]``, as every light model stores them) keep activations of
    order one through ReLU layers; batch-norm variances and scales stay positive."""
    op, k = role
    size = int(np.prod(shape))
    if op in ("Conv", "Gemm", "MatMul") and k == 1 and len(shape) > 1:
        return rng.standard_normal(shape) * np.sqrt(2.0 / (size // shape[0]))
    if (op == "BatchNormalization" and k in (1, 4)) or op == "Mul":  # scale, variance
        return rng.uniform(0.5, 1.5, shape)
    return rng.standard_normal(shape) * 0.1  # biases, means, shifts


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """``model`` (changed in place and returned) with every float weight, whether an
    initializer or a ``ConstantOfShape`` node, replaced by a seeded random initializer."""
    rng = np.random.default_rng(seed)
    graph = model.graph
    uses = _uses(graph)
    arrays = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    weights: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT:
            weights[init.name] = _random_weight(rng, arrays[init.name].shape, _role(init.name, uses))
    kept_nodes = []
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type != "ConstantOfShape" or value is None or value.data_type != onnx.TensorProto.FLOAT:
            kept_nodes.append(node)
            continue
        shape = tuple(int(d) for d in arrays[node.input[0]])
        weights[node.output[0]] = _random_weight(rng, shape, _role(node.output[0], uses))
    del graph.node[:]
    graph.node.extend(kept_nodes)
    still_used = {name for node in kept_nodes for name in node.input}
    kept_inits = [i for i in graph.initializer if i.name not in weights and i.name in still_used]
    kept_inputs = [i for i in graph.input if i.name not in arrays]  # IR 3 lists initializers as inputs
    for field, kept in ((graph.initializer, kept_inits), (graph.input, kept_inputs)):
        del field[:]
        field.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items())
    model.ir_version = max(model.ir_version, 4)  # initializers need not be inputs from IR 4 on
    return model


def _source(name: str, producers: dict[str, onnx.NodeProto]) -> str:
    """The initializer a value comes from, through reshapes (``name`` itself if none)."""
    while name in producers and producers[name].op_type in _PASS_THROUGH:
        name = producers[name].input[0]
    return name


def _last_linear_layer(graph: onnx.GraphProto) -> tuple[str, onnx.NodeProto]:
    """(logits, the Conv or Gemm that computes them up to positively homogeneous ops):
    the logits are the Softmax's input, or the graph's output when there is no Softmax."""
    producers = {out: node for node in graph.node for out in node.output}
    softmax = [n for n in graph.node if n.op_type == "Softmax"]
    logits = softmax[-1].input[0] if softmax else graph.output[0].name
    name = logits
    while producers[name].op_type in _HOMOGENEOUS:
        name = producers[name].input[0]
    layer = producers[name]
    if layer.op_type not in ("Conv", "Gemm"):
        raise ValueError(f"{graph.name}: logits come from {layer.op_type} {layer.name!r}, not a Conv or Gemm")
    return logits, layer


def calibrate_logits(model: onnx.ModelProto, rng: np.random.Generator, std: float = 2.0) -> onnx.ModelProto:
    """Scale the last Conv/Gemm's weight and bias so the logits have standard deviation
    ``std`` on a random input (ONNX Runtime measures them). Deep random networks give logits
    far from that (resnet50: ~1e4, a one-hot softmax for every input; inception_v1: ~0.2,
    a uniform one), and the ops between that layer and the logits (ReLU, pooling) are
    positively homogeneous, so scaling it scales the logits exactly."""
    graph = model.graph
    logits, layer = _last_linear_layer(graph)
    producers = {out: node for node in graph.node for out in node.output}
    outputs = list(graph.output)
    del graph.output[:]  # a probe of the logits alone (no copy: vgg19's weights are 0.5 GB)
    graph.output.append(onnx.helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, None))
    try:
        session = ort_session(model)
    finally:
        del graph.output[:]
        graph.output.extend(outputs)
    feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
             for i in session.get_inputs()}
    (measured,) = session.run(None, feeds)
    scale = std / float(np.std(measured))
    inits = {i.name: i for i in graph.initializer}
    for name in {_source(n, producers) for n in layer.input[1:3]}:
        inits[name].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(inits[name]) * np.float32(scale), name))
    return model


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """The onnx wheel's light model ``name`` with seeded random weights whose logits have
    a standard deviation of 2: outputs that differ from input to input."""
    from .conftest import light_model_path

    model = with_random_weights(onnx.load(light_model_path(name)), seed)
    return calibrate_logits(model, np.random.default_rng([seed, 1]))


def relax_main(params: Sequence[Any], body: Callable[..., Any]) -> Any:
    """An IRModule whose ``main(*params)`` returns ``body(bb, *params)`` from one dataflow block."""
    from tvm import relax

    bb = relax.BlockBuilder()
    with bb.function("main", list(params)):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def last_hidden_state(model: Any, **kwargs: Any) -> Any:
    """A ``transformers`` text model as ``forward(ids, mask) -> last_hidden_state`` (the
    mask positional, ``kwargs`` such as ``use_cache=False`` passed through): the form
    ``torch.export`` captures with a tokenizer's two outputs."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: Any, mask: Any) -> Any:
            return self.model(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state

    return LastHidden().eval()


def cuda_source(module: Any) -> str | None:
    """The CUDA source of the CUDA module that ``module`` (a built executable or a runtime
    module) imports, directly or through its imports; None when it imports none."""
    pending = [getattr(module, "mod", module)]
    while pending:
        current = pending.pop()
        if current.kind == "cuda":
            return current.inspect_source()
        pending.extend(current.imports)
    return None


def _numpy_int8(weight: np.ndarray) -> np.ndarray:
    """``weight`` [out, in] rounded to symmetric per-output-channel int8 and back, by numpy:
    ``scale = max|w| / 127``, ``rint`` (half to even), clipped to [-127, 127]."""
    amax = np.abs(weight).max(axis=1)
    scale = np.where(amax > 0, amax / 127, 1.0).astype(np.float32)
    q = np.clip(np.rint(weight / scale[:, None]), -127, 127)
    return (q * scale[:, None]).astype(np.float32)


def _numpy_int4(weight: np.ndarray) -> np.ndarray:
    """``weight`` [out, in] rounded to symmetric int4 in groups of 32 inputs and back, by
    numpy: ``scale = max|w| / 7`` (as float16 when every scale of the layer is a normal
    float16; a layer's outputs padded with zero rows to a multiple of 64 count there),
    ``rint`` by that scale, clipped to [-7, 7]; a layer whose inputs are no multiple of 32
    is rounded to int8 (``_numpy_int8``)."""
    out, inputs = weight.shape
    if inputs % 32:
        return _numpy_int8(weight)
    groups = weight.reshape(out, inputs // 32, 32)
    amax = np.abs(groups).max(axis=2)
    scale = np.where(amax > 0, amax / 7, 1.0).astype(np.float32)
    if -out % 64:  # the padding rows' scales are 1
        scale_all = np.concatenate([scale, np.ones((1, scale.shape[1]), np.float32)])
    else:
        scale_all = scale
    if scale_all.min() >= 2.0 ** -14 and scale_all.max() <= 65504:
        scale = scale.astype(np.float16).astype(np.float32)
    v = np.clip(np.rint(groups / scale[:, :, None]), -7, 7)
    return (v * scale[:, :, None]).astype(np.float32).reshape(out, inputs)


def rounded_copy(model: Any, weights: str = "int8") -> Any:
    """A copy of a transformers causal LM whose linear weights (``nn.Linear`` and GPT-2's
    ``Conv1D``, the LM head included; not the embedding) are rounded to int8 (or, with
    ``weights="int4"``, to int4 groups: ``_numpy_int4``) by numpy: the reference of
    ``compile_causal_lm(weights=...)``, independent of its quantizer."""
    import copy

    import torch

    rounded = {"int8": _numpy_int8, "int4": _numpy_int4}[weights]
    ref = copy.deepcopy(model)
    # a head tied to the embedding (GPT-2) is rounded alone: the embedding stays float32
    ref.lm_head.weight = torch.nn.Parameter(ref.lm_head.weight.detach().clone())
    with torch.no_grad():
        for mod in ref.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(torch.from_numpy(rounded(mod.weight.numpy())))
            elif type(mod).__name__ == "Conv1D":  # GPT-2: weight stored [in, out]
                mod.weight.copy_(torch.from_numpy(rounded(mod.weight.numpy().T).T.copy()))
    return ref


def rounded_int8_groups(x: np.ndarray, group: int = 32) -> np.ndarray:
    """``x [..., K]`` rounded to int8 per group of ``group`` inputs by numpy, in float32 as
    ``compile_causal_lm(activations="int8")`` states it: ``s = max|x| / 127`` (1 for a
    group of zeros), ``round(x / s)`` half to even in [-127, 127], times ``s``."""
    g = x.reshape(*x.shape[:-1], -1, group).astype(np.float32)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    s = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    return (np.clip(np.rint(g / s), -127, 127).astype(np.float32) * s).reshape(x.shape)


def round_linear_inputs(model: Any) -> Any:
    """``model`` (in place) with every linear layer's input rounded by
    ``rounded_int8_groups`` (numpy) before the layer: the reference of int8 activations."""
    import torch

    def hook(_module: Any, args: tuple) -> tuple:
        return (torch.from_numpy(rounded_int8_groups(args[0].detach().numpy())), *args[1:])

    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D":
            mod.register_forward_pre_hook(hook)
    return model


def compile_quantized(model: Any, weights: str, max_length: int, activations: str = "float32") -> Any:
    """``compile_causal_lm(model, max_length, weights=weights)``, checking that the user's
    model is not changed by the quantization (its state dict equal before and after)."""
    import torch

    import aicf_tvm

    before = {k: v.clone() for k, v in model.state_dict().items()}
    lm = aicf_tvm.compile_causal_lm(model, max_length=max_length, weights=weights, activations=activations)
    for k, v in model.state_dict().items():  # the user's model is not quantized
        assert torch.equal(v, before[k]), k
    return lm


def constant_elements(constants: Sequence, dtype: str) -> int:
    """Elements of the ``constants`` (``relax_constants``) of ``dtype``."""
    return sum(int(np.prod([int(d) for d in c.ty.shape])) for c in constants if str(c.ty.dtype) == dtype)


def weight_decisions(lm: Any, form: str) -> tuple[list, list[float]]:
    """The report's ``approximate:weights_<form>`` decisions of ``lm`` and the relative
    error each states."""
    found = [d for d in lm.model.report.decisions if d.candidate == f"approximate:weights_{form}"]
    return found, [float(d.note.split("relative error ")[1].split()[0]) for d in found]


def relax_constants(mod: Any, names: Sequence[str] = ("main",)) -> list:
    """The constants the Relax functions ``names`` of ``mod`` hold, each object once (the
    functions of one library share theirs)."""
    import tvm
    from tvm import relax

    found: dict = {}
    for name in names:
        relax.analysis.post_order_visit(mod[name], lambda e: found.setdefault(e, None)
                                        if isinstance(e, tvm.ir.Constant) else None)
    return list(found)
