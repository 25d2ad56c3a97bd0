"""The op table: every Relax op we lift to a non-opaque Emit.

Covers the ops TVM's ONNX frontend produces for the light models shipped with the
``onnx`` wheel, a BERT-style encoder layer, a LLaMA-style decoder block, and the
common elementwise, reduction and view ops. Anything else is ``opaque``.
"""

from __future__ import annotations

from . import views
from .registry import (
    BROADCAST,
    CONV,
    CREATION,
    ELEMENTWISE,
    EXTERN,
    INJECTIVE,
    MATMUL,
    NORM,
    POOL,
    REDUCTION,
    SCAN,
    SOFTMAX,
    VIEW,
    register,
)

_UNARY = ["abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "erf", "exp", "floor", "log",
          "negative", "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "square", "tan", "tanh", "trunc",
          "logical_not", "bitwise_not", "isfinite", "isinf", "isnan", "clip", "astype", "nn.relu", "nn.silu", "nn.gelu",
          "nn.leakyrelu", "nn.selu", "nn.softplus"]

_BINARY = ["add", "subtract", "multiply", "divide", "floor_divide", "floor_mod", "mod", "power", "maximum", "minimum",
           "atan2", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or",
           "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "log_add_exp",
           "where", "nn.prelu", "ewise_fma"]

_REDUCE = ["sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin"]

_INJECTIVE = ["concat", "split", "take", "tile", "repeat", "flip", "nn.pad", "layout_transform", "gather_elements",
              "gather_nd", "stack", "one_hot", "tril", "triu", "image.resize2d", "nn.pixel_shuffle", "collapse_sum_to",
              "collapse_sum_like", "index_tensor"]

_CREATION = ["zeros", "ones", "full", "arange", "eye", "zeros_like", "ones_like", "full_like", "eye_like"]

for _name in _UNARY:
    register(f"relax.{_name}", ELEMENTWISE)
register("relax.nn.gelu_tanh", ELEMENTWISE, math="approx:gelu_tanh")
register("relax.nn.dropout", ELEMENTWISE)  # a tuple (out, mask); identity in inference

for _name in _BINARY:
    register(f"relax.{_name}", BROADCAST)

for _name in _REDUCE:
    register(f"relax.{_name}", REDUCTION)

for _name in _INJECTIVE:
    register(f"relax.{_name}", INJECTIVE)
# einsum/outer are not pointwise gathers; keep them from elementwise fusion.
for _name in ("einsum", "outer"):
    register(f"relax.{_name}", MATMUL)
# lowered by TVM's sort/scan dispatch (an extern sort on some targets): never in a group
for _name in ("sort", "argsort", "topk", "cumsum", "cumprod"):
    register(f"relax.{_name}", SCAN)
# TOPI's kernels for these are te.extern / ir_builder code: each is its own kernel
for _name in ("scatter_elements", "scatter_nd", "median"):
    register(f"relax.{_name}", EXTERN)

for _name in _CREATION:
    register(f"relax.{_name}", CREATION)

register("relax.reshape", VIEW, strides=views.reshape)
register("relax.flatten", VIEW, strides=views.reshape)
register("relax.nn.batch_flatten", VIEW, strides=views.reshape)
register("relax.permute_dims", VIEW, strides=views.permute_dims)
register("relax.squeeze", VIEW, strides=views.squeeze)
register("relax.expand_dims", VIEW, strides=views.expand_dims)
register("relax.strided_slice", VIEW, strides=views.strided_slice)
register("relax.broadcast_to", VIEW, strides=views.broadcast_to)

register("relax.matmul", MATMUL)
for _name in ("conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose", "conv3d_transpose"):
    register(f"relax.nn.{_name}", CONV)
for _name in ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
              "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d"):
    register(f"relax.nn.{_name}", POOL)
for _name in ("layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm"):
    register(f"relax.nn.{_name}", NORM)
register("relax.nn.softmax", SOFTMAX)
register("relax.nn.log_softmax", SOFTMAX)
register("relax.nn.attention", SOFTMAX, kind="attention")
register("relax.nn.attention_bias", SOFTMAX, kind="attention_bias")
