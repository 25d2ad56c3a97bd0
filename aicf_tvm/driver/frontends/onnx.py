"""ONNX import: input shapes (symbolic where the model says so), shape folding, TVM's frontend.

Input dims: a ``dim_value`` is static; a named ``dim_param`` becomes one ``tirx.Var`` per
name, shared by every input that names it (``batch`` of ``input_ids`` and of
``attention_mask`` is one size); an unnamed dynamic dim becomes a fresh var of its own
(two unnamed dims need not agree). ``shapes=`` sets any input's shape: an int pins a dim,
a name makes it symbolic (one var per name across the inputs, the model's own names
included), ``"?"`` keeps the model's dim. The shapes are written into the graph before
``fold_shapes`` so that shape computations on pinned dims fold to constants (see
``onnx_fold``). ``bounds=`` gives symbolic dims their ``(lower, upper)`` bounds (see
``aicf_tvm.driver.symbolic.with_dim_bounds``).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import tvm
from tvm import relax, tirx

from aicf_tvm.core.errors import UnsupportedModelError
from relax_passes.integer_qdq import constant_value

from ..symbolic import with_dim_bounds
from .common import first_line, normalize_import
from .onnx_fold import fold_shapes

Dim = int | tirx.Var

if TYPE_CHECKING:
    import onnx

    # an ONNX model as ``from_onnx`` takes it: a file path, the file's bytes, or loaded
    OnnxModel = str | os.PathLike | bytes | onnx.ModelProto


def _load_onnx(path_or_model: OnnxModel) -> tuple[onnx.ModelProto, str]:
    import onnx

    if not isinstance(path_or_model, (str, os.PathLike, bytes)):
        if not isinstance(path_or_model, onnx.ModelProto):
            raise UnsupportedModelError(
                f"cannot import a {type(path_or_model).__name__}: give an ONNX file, bytes or ModelProto, "
                "a built-in model name, or a tvm.IRModule (a PyTorch module: aicf_tvm.from_torch(module, args))")
        return path_or_model, "<in-memory model>"
    if isinstance(path_or_model, bytes):
        try:
            return onnx.load_from_string(path_or_model), "<bytes>"
        except Exception as err:
            raise UnsupportedModelError(f"the given bytes are not an ONNX model ({err})") from err
    path = os.fspath(path_or_model)
    if not os.path.exists(path):
        raise UnsupportedModelError(f"{path}: no such file")
    try:
        return onnx.load(path), path
    except Exception as err:
        raise UnsupportedModelError(f"{path}: not an ONNX model ({type(err).__name__}: {err})") from err


def real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are not initializers (old models list weights among inputs)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int | str]] | None = None,
                 name: str = "<model>") -> dict[str, list[Dim]]:
    """Each real input's shape, dynamic dims as ``tirx.Var`` (module docstring); inputs of
    unknown rank and not given a shape are left out (TVM's frontend gives them no static
    shape)."""
    inputs = real_inputs(model)
    unknown = sorted(set(shapes or {}) - {i.name for i in inputs})
    if unknown:
        raise UnsupportedModelError(f"{name}: shapes= names {', '.join(unknown)}, not an input; the inputs are: "
                                    f"{', '.join(i.name for i in inputs)}")
    named: dict[str, tirx.Var] = {}

    def var(dim_name: str) -> tirx.Var:
        return named.setdefault(dim_name, tirx.Var(dim_name, "int64"))

    result: dict[str, list[Dim]] = {}
    for inp in inputs:
        tensor = inp.type.tensor_type
        own = [
            d.dim_value if d.HasField("dim_value") else var(d.dim_param) if d.dim_param
            else tirx.Var(f"{inp.name}_dim{k}", "int64")
            for k, d in enumerate(tensor.shape.dim)
        ] if tensor.HasField("shape") else None
        if shapes and inp.name in shapes:
            given = list(shapes[inp.name])
            if own is not None and len(own) != len(given):
                raise UnsupportedModelError(f"{name}: input {inp.name} has rank {len(own)}, "
                                            f"shapes= gives {given}")
            if own is None and "?" in given:
                raise UnsupportedModelError(f"{name}: input {inp.name} has no shape in the model to keep "
                                            f"'?' dims of (shapes= gives {given})")
            result[inp.name] = [_given_dim(d, own[k] if own else None, var, inp.name) for k, d in enumerate(given)]
        elif own is not None:
            result[inp.name] = own
    return result


def _given_dim(dim: int | str, own: Dim | None, var: Callable[[str], tirx.Var], input_name: str) -> Dim:
    """One dim of ``shapes=``: an int pins it, ``"?"`` keeps the model's, a name is symbolic."""
    if isinstance(dim, str) and dim == "?":
        return own
    if isinstance(dim, str):
        if not dim.isidentifier():
            raise UnsupportedModelError(f"input {input_name}: dim {dim!r} is neither a size, '?' nor a name")
        return var(dim)
    return int(dim)


def _set_shapes(model: onnx.ModelProto, shape_dict: Mapping[str, Sequence[Dim]]) -> None:
    """Write the given shapes into ``model``'s inputs (vars as dim_params)."""
    for inp in model.graph.input:
        if inp.name not in shape_dict:
            continue
        shape = inp.type.tensor_type.shape
        del shape.dim[:]
        for dim in shape_dict[inp.name]:
            if isinstance(dim, int):
                shape.dim.add().dim_value = dim
            else:
                shape.dim.add().dim_param = dim.name


def from_onnx(path_or_model: OnnxModel, shapes: Mapping[str, Sequence[int | str]] | None = None,
              bounds: Mapping[str, tuple[int | None, int | None]] | None = None) -> tvm.IRModule:
    """Import an ONNX model (path, bytes or ``onnx.ModelProto``) with TVM's ONNX frontend,
    after ONNX shape inference and folding of shape subgraphs (``shapes=``, ``bounds=``:
    the module docstring)."""
    model, name = _load_onnx(path_or_model)
    shape_dict = input_shapes(model, shapes, name)
    prepared = fold_shapes(model, lambda light: _set_shapes(light, shape_dict), _check_model)
    with _own_converters():
        _check_ops(prepared, name)
        try:
            mod = _tvm_import(prepared, shape_dict)
        except UnsupportedModelError as err:
            raise UnsupportedModelError(f"{name}: {err}") from err
        except Exception as err:
            raise UnsupportedModelError(f"{name}: the ONNX frontend failed: {type(err).__name__}: "
                                        f"{first_line(err)}") from err
    return normalize_import(with_dim_bounds(mod, bounds or {}))


def _check_model(weightless: onnx.ModelProto) -> None:
    """``onnx.checker.check_model`` as TVM's ``from_onnx`` runs it (a warning, not an
    error), on the graph without its weights' bytes (``onnx_fold.weightless``)."""
    import onnx

    try:
        onnx.checker.check_model(weightless)
    except Exception as err:  # noqa: BLE001 - TVM's frontend warns and goes on; so do we
        warnings.warn(str(err), stacklevel=3)


def _tvm_import(model: onnx.ModelProto, shape_dict: Mapping[str, Sequence[Dim]]) -> tvm.IRModule:
    """TVM's ``relax.frontend.onnx.from_onnx(model, shape_dict, keep_params_in_input=False)``
    less its ``check_model`` of the whole model, which serializes every weight
    (``_check_model`` checks the graph instead)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    if model.ir_version < 3:
        raise UnsupportedModelError(f"ONNX IR version {model.ir_version} is not supported (at least 3)")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    importer = onnx_frontend.ONNXGraphImporter(dict(shape_dict), "float32", keep_params_in_input=False,
                                               sanitize=True)
    return importer.from_onnx(model.graph, opset)


@contextlib.contextmanager
def _own_converters() -> Iterator[None]:
    """TVM's ONNX frontend with our converters where its own fail (it has no
    ``custom_convert_map``): its table of converters is replaced while the import runs."""
    from tvm.relax.frontend.onnx import onnx_frontend

    table = onnx_frontend._get_convert_map

    def ours() -> dict:
        return {**table(), "Expand": _expand_class(onnx_frontend.Expand), "Clip": _clip_class(onnx_frontend.Clip),
                "Pad": _pad_class(onnx_frontend.Pad),
                "MatMulInteger": _matmul_integer_class(onnx_frontend.MatMulInteger),
                "Col2Im": _col2im_class(onnx_frontend.OnnxOpConverter)}

    onnx_frontend._get_convert_map = ours
    try:
        yield
    finally:
        onnx_frontend._get_convert_map = table


def _expand_class(base: type) -> type:
    """``Expand`` to a constant shape of data whose dims are symbolic expressions (a
    ``NonZero`` count, Longformer's), which TVM's converter reads as integers: each output
    dim is the target's, or the data's where the target has 1 (ONNX broadcasting), one
    ``broadcast_to``; data of constant dims goes to TVM's converter."""

    class Expand(base):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            data, shape = inputs[0], inputs[1]
            dims = getattr(getattr(data.ty, "shape", None), "values", None)
            if (not isinstance(shape, tvm.ir.GenericConst) or dims is None
                    or all(isinstance(d, tirx.IntImm) for d in dims)):
                return super()._impl_v13(bb, inputs, attr, params)
            target = [int(t) for t in shape.value.numpy().tolist()]
            rank = max(len(target), len(dims))
            dims = [tirx.IntImm("int64", 1)] * (rank - len(dims)) + list(dims)
            target = [1] * (rank - len(target)) + target
            if data.ty.ndim < rank:
                data = bb.normalize(relax.op.reshape(data, dims))
            return relax.op.broadcast_to(data, [d if t == 1 else t for d, t in zip(dims, target)])

    return Expand


def _clip_class(base: type) -> type:
    """``Clip`` with constant, non-NaN ``min``/``max`` inputs (opset 11+: an exported
    ReLU6) as Relax ``maximum``/``minimum`` of those constants, where TVM's converter
    emits TE kernels (``emit_te``): a ``call_tir`` is opaque to our passes, so every ReLU6
    of an exported MobileNet stayed two kernels of its own. The same ops on the same
    values, legalized as TVM's are. Other bounds (given at run time, or NaN, on which
    ONNX's reference evaluator, ONNX Runtime and TVM's converter disagree) go to TVM's
    converter."""

    def constant(bound: relax.Expr | None) -> bool:
        if bound is None:
            return True
        if not isinstance(bound, tvm.ir.GenericConst) or str(bound.ty.dtype) not in ("float16", "float32", "float64"):
            return False
        return not np.isnan(bound.value.numpy()).any()

    class Clip(base):
        @classmethod
        def _impl_v13(cls, bb, inputs, attr, params):
            if not (constant(inputs[1]) and constant(inputs[2])):
                return super()._impl_v13(bb, inputs, attr, params)
            out = inputs[0]
            if inputs[1] is not None:
                out = bb.emit(relax.op.maximum(out, inputs[1]))
            if inputs[2] is not None:
                out = bb.emit(relax.op.minimum(out, inputs[2]))
            return out

        @classmethod
        def _impl_v11(cls, bb, inputs, attr, params):
            return cls._impl_v13(bb, inputs, attr, params)

    return Clip


def _pad_class(base: type) -> type:
    """``Pad`` (opset 11+) of a float tensor in constant mode by constant, non-negative
    pads as Relax ``nn.pad``, where TVM's converter emits a TE kernel (``emit_te`` of
    ``topi.nn.pad``): opaque to our passes, so the zero pad an exporter writes before
    each convolution (MobileNetV2's "same" padding) stayed a kernel and a copy of the
    activation instead of the convolution's own padding (``FoldPadIntoConv``). Relax's
    ``nn.pad`` legalizes to the same ``topi.nn.pad``. Other pads go to TVM's converter.
    A pad value given as a dequantized constant (a QDQ model's, which the importer keeps
    unfolded for ``relax_passes.integer_qdq``) is that constant's value, as TVM's converter
    needs it."""

    class Pad(base):
        @classmethod
        def _lower_pad(cls, bb, inputs, attr, params, allowed_modes):
            if len(inputs) > 2 and isinstance(inputs[2], relax.Call):
                value = constant_value(inputs[2], bb.lookup_binding)
                if value is not None:
                    inputs = [*inputs[:2], relax.const(value, str(value.dtype)), *inputs[3:]]
            data = inputs[0]
            dtype = str(getattr(data.ty, "dtype", ""))
            if attr.get("mode", b"constant").decode("utf-8") == "constant" and dtype.startswith("float"):
                before, after, value = cls._parse_pads_and_axes(inputs, params)
                if all(int(w) >= 0 for w in [*before, *after]):
                    widths = [int(w) for pair in zip(before, after) for w in pair]
                    return bb.emit(relax.op.nn.pad(data, widths, "constant", float(value)))
            return super()._lower_pad(bb, inputs, attr, params, allowed_modes)

    return Pad


def _col2im_class(base: type) -> type:
    """``Col2Im`` (opset 18; PyTorch's ``F.fold``, MobileViTV2's), which TVM's frontend
    lacks, for two spatial dims, a constant image and block shape: the input read as
    ``[N, C, kh, kw, nh, nw]``, each block position's ``[N, C, nh, nw]`` spread over the
    padded image at its stride (zeros between, a reshape and a pad) and offset (its
    dilation), the ``kh * kw`` of them added to zeros in block order, as ONNX's reference
    and ONNX Runtime accumulate (a position's contributions in increasing block index,
    after a zero: ``-0.0`` sums to ``+0.0`` as theirs do), then the pads cut off."""

    def ints(name: str, attr: dict, default: list[int]) -> list[int]:
        return [int(v) for v in attr.get(name, default)]

    class Col2Im(base):
        @classmethod
        def _impl_v18(cls, bb, inputs, attr, params):
            data, image, block = inputs
            if not (isinstance(image, tvm.ir.GenericConst) and isinstance(block, tvm.ir.GenericConst)):
                raise UnsupportedModelError("Col2Im with an image or block shape computed at run time")
            (height, width), (kh, kw) = ([int(v) for v in c.value.numpy()] for c in (image, block))
            dh, dw = ints("dilations", attr, [1, 1])
            sh, sw = ints("strides", attr, [1, 1])
            top, left, bottom, right = ints("pads", attr, [0, 0, 0, 0])
            dims = list(data.ty.shape.values)
            if len(dims) != 3 or not all(isinstance(d, tirx.IntImm) for d in dims[1:]):
                raise UnsupportedModelError("Col2Im of an input whose channels or blocks are not constant")
            batch, channels_blocks, blocks = dims[0], int(dims[1]), int(dims[2])
            tall, wide = height + top + bottom, width + left + right
            nh, nw = (tall - (dh * (kh - 1) + 1)) // sh + 1, (wide - (dw * (kw - 1) + 1)) // sw + 1
            if channels_blocks % (kh * kw) or nh * nw != blocks or nh < 1 or nw < 1:
                raise UnsupportedModelError(f"Col2Im of a [{channels_blocks}, {blocks}] input into a "
                                            f"{height}x{width} image by {kh}x{kw} blocks: the sizes disagree")
            channels = channels_blocks // (kh * kw)
            dtype = str(data.ty.dtype)
            cols = bb.emit(relax.op.reshape(data, [batch, channels, kh, kw, nh, nw]))
            out = bb.emit(relax.op.zeros([batch, channels, tall, wide], dtype))
            span_h, span_w = (nh - 1) * sh + 1, (nw - 1) * sw + 1
            for i in range(kh):
                for j in range(kw):
                    part = relax.op.strided_slice(cols, [2, 3], [i, j], [i + 1, j + 1])
                    part = relax.op.reshape(part, [batch, channels, nh, 1, nw, 1])
                    part = relax.op.nn.pad(part, [0, 0, 0, 0, 0, 0, 0, sh - 1, 0, 0, 0, sw - 1])
                    part = relax.op.reshape(part, [batch, channels, nh * sh, nw * sw])
                    part = relax.op.strided_slice(part, [2, 3], [0, 0], [span_h, span_w])
                    part = relax.op.nn.pad(part, [0, 0, 0, 0, i * dh, tall - i * dh - span_h,
                                                  j * dw, wide - j * dw - span_w])
                    out = bb.emit(relax.op.add(out, part))
            return relax.op.strided_slice(out, [2, 3], [top, left], [top + height, left + width])

    return Col2Im


# MatMulInteger's sums of uint8 x int8 products fit int32 for K below 2^31 / (255 * 128)
_MAX_INTEGER_K = (2**31 - 1) // (255 * 128)


def _matmul_integer_class(base: type) -> type:
    """``MatMulInteger`` (``quantize_dynamic``'s matmul) of uint8 data by a constant int8
    ``[K, N]`` weight with zero point 0 as ``relax.matmul(a, b, out_dtype="int32")`` minus
    ``a_zero_point * sum_k b[k, n]``: ONNX's ``(A - a_zp) @ B`` exactly (int32 sums of at
    most 65793 products, no overflow; the integer kernels of
    ``relax_passes.legalize_int8_matmul`` take it), where TVM's converter widens both
    operands to int32 first, which no integer kernel takes. Other forms go to TVM's."""

    class MatMulInteger(base):
        @classmethod
        def _impl_v10(cls, bb, inputs, attr, params):
            a, b = inputs[0], inputs[1]
            a_zp = inputs[2] if len(inputs) > 2 else None
            b_zp = inputs[3] if len(inputs) > 3 else None
            b_value = b.value.numpy() if isinstance(b, tvm.ir.Constant) else None
            zero_b = b_zp is None or (isinstance(b_zp, tvm.ir.Constant) and not b_zp.value.numpy().any())
            scalar_a_zp = a_zp is None or (getattr(a_zp.ty, "ndim", -1) in (0, 1) and
                                          [int(d) for d in getattr(a_zp.ty.shape, "values", [0])] in ([], [1]))
            if (b_value is None or b_value.dtype != np.int8 or b_value.ndim != 2 or str(a.ty.dtype) != "uint8"
                    or not zero_b or not scalar_a_zp or b_value.shape[0] > _MAX_INTEGER_K):
                return super()._impl_v10(bb, inputs, attr, params)
            product = relax.op.matmul(a, b, out_dtype="int32")
            if a_zp is None:
                return product
            sums = relax.const(b_value.astype(np.int32).sum(axis=0).astype(np.int32))
            shift = relax.op.multiply(relax.op.astype(relax.op.reshape(a_zp, []), "int32"), sums)
            return relax.op.subtract(product, shift)

    return MatMulInteger


def _check_ops(model: onnx.ModelProto, name: str) -> None:
    """Name the first node whose operator TVM's ONNX frontend does not convert."""
    from tvm.relax.frontend.onnx import onnx_frontend

    table = onnx_frontend._get_convert_map()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in table:
            raise UnsupportedModelError(
                f"{name}: operator {node.domain + '.' if node.domain else ''}{node.op_type} "
                f"(node {node.name or '<unnamed>'}) is not supported by TVM's ONNX frontend"
            )
