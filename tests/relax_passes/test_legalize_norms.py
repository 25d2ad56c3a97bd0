"""Norms and statistics with the corrected two-pass variance (relax_passes/legalize_norms.py).

GroupNorm, LayerNorm and InstanceNorm from PyTorch and from ONNX, the written-out forms
(``x.mean``/``x.var`` in PyTorch, ReduceMean/Sub/Pow/ReduceMean in ONNX), on inputs whose
mean is 0, 10, 100 and 1000 times their spread, compiled whole and compared with a float64
reference. The bar is PyTorch's own float32 error against that reference, times
``FACTOR``: our output rounds through about five float32 operations where PyTorch's
vectorized kernel rounds through two or three, so statistics as accurate as PyTorch's
still show up to about twice its error on the largest of ~10^4 outputs; 4x leaves room
for that, while the one-pass ``E[x²] - E[x]²`` (GroupNorm, InstanceNorm) and the serial
float32 mean (LayerNorm, ``mean``) gave up to 7x at mean 0 and 10^2-10^5x (or NaN) above.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from tvm import tirx

import aicf_tvm
from relax_passes.legalize_norms import partial_count

MEANS = (0.0, 10.0, 100.0, 1000.0)
FACTOR = 4.0


def shifted(shape: tuple[int, ...], mean: float, seed: int) -> np.ndarray:
    """Standard-normal float32 values around ``mean``."""
    return (np.random.default_rng(seed).standard_normal(shape) + mean).astype(np.float32)


def check_means(compiled, reference, shape: tuple[int, ...], seed: int) -> None:
    """At every mean of MEANS: our max error against ``reference``'s float64 result within
    FACTOR times ``reference``'s float32 one (``reference(x, dtype)`` runs PyTorch)."""
    for i, mean in enumerate(MEANS):
        x = shifted(shape, mean, seed + i)
        exact = reference(x, torch.float64)
        ours = float(np.abs(np.asarray(compiled(x), np.float64) - exact).max())
        theirs = float(np.abs(reference(x, torch.float32).astype(np.float64) - exact).max())
        assert ours <= FACTOR * theirs, f"mean {mean}: error {ours:.3g}, PyTorch's {theirs:.3g}"


def with_random_affine(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``module`` in eval mode with gamma around 1 and beta around 0, distinct values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.weight.copy_(1 + 0.5 * torch.randn(module.weight.shape, generator=gen))
        module.bias.copy_(torch.randn(module.bias.shape, generator=gen))
    return module.eval()


def check_torch_module(module: torch.nn.Module, shape: tuple[int, ...], seed: int) -> None:
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, (torch.zeros(shape),)), target="llvm")

    def reference(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
        with torch.no_grad():
            return module.to(dtype)(torch.from_numpy(x).to(dtype)).numpy()

    check_means(compiled, reference, shape, seed)
    module.float()


@pytest.mark.parametrize("groups,channels,shape", [
    (32, 256, (1, 256, 8, 8)),  # BiT's GroupNorm
    (8, 64, (2, 64, 50)),  # 1-D spatial
    (8, 64, (1, 64, 4, 6, 5)),  # 3-D spatial
], ids=["2d", "1d", "3d"])
def test_group_norm_from_pytorch_is_as_accurate_as_pytorch(groups, channels, shape):
    check_torch_module(with_random_affine(torch.nn.GroupNorm(groups, channels), 1), shape, 10)


@pytest.mark.parametrize("width,shape", [(768, (16, 768)), (1000, (2, 3, 1000))])
def test_layer_norm_from_pytorch_is_as_accurate_as_pytorch(width, shape):
    check_torch_module(with_random_affine(torch.nn.LayerNorm(width), 2), shape, 20)


def test_instance_norm_from_pytorch_is_as_accurate_as_pytorch():
    module = with_random_affine(torch.nn.InstanceNorm2d(16, affine=True), 3)
    check_torch_module(module, (2, 16, 12, 12), 30)


class WrittenNorm(torch.nn.Module):
    """A norm written with ``mean`` and ``var`` (relax.mean, relax.variance)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(-1, keepdim=True)
        return centered / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)


def test_written_norm_from_pytorch_is_as_accurate_as_pytorch():
    check_torch_module(WrittenNorm(), (16, 768), 40)


def onnx_model(nodes: list, shape: tuple[int, ...], weights: dict[str, np.ndarray],
               opset: int) -> onnx.ModelProto:
    """A graph from input ``x`` to output ``y``, both of ``shape``, with ``weights``."""
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in "xy")
    constants = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "norm", [x], [y], initializer=constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def affine_weights(width: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"gamma": (1 + 0.5 * rng.standard_normal(width)).astype(np.float32),
            "beta": rng.standard_normal(width).astype(np.float32)}


def functional(norm: Callable, w: dict[str, np.ndarray]) -> Callable:
    """``reference(x, dtype)``: PyTorch's ``norm(x, gamma, beta)`` in ``dtype``."""
    def reference(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
        g, b = (torch.from_numpy(w[k]).to(dtype) for k in ("gamma", "beta"))
        return norm(torch.from_numpy(x).to(dtype), g, b).numpy()

    return reference


def layer_norm_768(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (768,), g, b, 1e-5)


def check_onnx(model: onnx.ModelProto, shape: tuple[int, ...], reference, seed: int) -> None:
    check_means(aicf_tvm.compile(model, target="llvm"), reference, shape, seed)


def test_layer_normalization_from_onnx_is_as_accurate_as_pytorch():
    shape, w = (16, 768), affine_weights(768, 4)
    node = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], epsilon=1e-5)
    check_onnx(onnx_model([node], shape, w, 17), shape, functional(layer_norm_768, w), 50)


def test_written_layer_norm_from_onnx_is_as_accurate_as_pytorch():
    """ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add: fused_layernorm."""
    shape, w = (16, 768), affine_weights(768, 5)
    w |= {"axes": np.array([-1], np.int64), "two": np.array(2.0, np.float32),
          "eps": np.array(1e-5, np.float32)}
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"]),
        helper.make_node("Sub", ["x", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["var"]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["std"]),
        helper.make_node("Div", ["d", "std"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["s"]),
        helper.make_node("Add", ["s", "beta"], ["y"]),
    ]
    check_onnx(onnx_model(nodes, shape, w, 18), shape, functional(layer_norm_768, w), 60)


@pytest.mark.parametrize("shape", [(1, 64, 10, 10), (2, 64, 30)], ids=["2d", "1d"])
def test_group_normalization_from_onnx_is_as_accurate_as_pytorch(shape):
    w = affine_weights(64, 6)
    node = helper.make_node("GroupNormalization", ["x", "gamma", "beta"], ["y"], num_groups=8,
                            epsilon=1e-5)
    reference = functional(lambda v, g, b: torch.nn.functional.group_norm(v, 8, g, b, 1e-5), w)
    check_onnx(onnx_model([node], shape, w, 21), shape, reference, 70)


def test_instance_normalization_from_onnx_is_as_accurate_as_pytorch():
    """TVM's ONNX frontend writes it as mean, variance, subtract, divide (relax.variance)."""
    shape, w = (2, 16, 12, 12), affine_weights(16, 7)
    node = helper.make_node("InstanceNormalization", ["x", "gamma", "beta"], ["y"], epsilon=1e-5)
    reference = functional(
        lambda v, g, b: torch.nn.functional.instance_norm(v, weight=g, bias=b, eps=1e-5), w)
    check_onnx(onnx_model([node], shape, w, 17), shape, reference, 80)


def test_special_rows_follow_pytorch():
    """A row holding NaN or inf is NaN throughout (as in PyTorch); a constant row gives
    beta exactly (the variance 0, not a rounding residue); other rows are untouched."""
    module = with_random_affine(torch.nn.LayerNorm(64), 8)
    x = shifted((6, 64), 100.0, 90)
    x[1, 5], x[2, 7], x[3, :] = np.nan, np.inf, 123.25
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, (torch.from_numpy(x),)), target="llvm")
    ours = np.asarray(compiled(x))
    assert np.isnan(ours[1:3]).all() and not np.isnan(ours[[0, 3, 4, 5]]).any()
    with torch.no_grad():
        np.testing.assert_array_equal(ours[3], module.bias.numpy())
        np.testing.assert_allclose(ours[[0, 4, 5]], module(torch.from_numpy(x)).numpy()[[0, 4, 5]],
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("extent,dtype,count", [
    (768, "float32", 64), (96, "float32", 32), (48, "float32", 16), (768, "float64", 32),
    (1000, "float32", 10), (14, "float32", 14), (28, "float64", 7), (197, "float32", 1),
])
def test_partial_count_takes_whole_vectors_or_at_most_one(extent, dtype, count):
    """4, 2 or 1 vectors of 512 bits when they divide the axis, else a divisor up to one
    vector, else one serial sum (197 is prime)."""
    assert partial_count(tirx.IntImm("int64", extent), dtype) == count


def test_partial_count_is_one_for_a_symbolic_extent():
    assert partial_count(tirx.Var("n", "int64"), "float32") == 1
