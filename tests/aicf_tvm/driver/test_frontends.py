"""Frontends: ONNX and PyTorch models compile and agree with their own runtimes; bad files are
UnsupportedModelErrors that name the file (and the op and node for an unsupported operator)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicf_tvm
from aicf_tvm import UnsupportedModelError
from aicf_tvm.driver.frontends import load_model

from ...helpers import assert_matches_reference, last_hidden_state, ort_function, torch_function
from .test_cli import unsupported_op_model


def small_onnx_mlp() -> onnx.ModelProto:
    """x[2, 8] @ w[8, 16] + b, relu, softmax: a model ONNX Runtime and AICF both run."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["h"], name="bias"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Softmax", ["r"], ["y"], name="sm", axis=-1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_from_onnx_matches_onnxruntime():
    pytest.importorskip("onnxruntime")
    model = small_onnx_mlp()
    compiled = aicf_tvm.compile(aicf_tvm.from_onnx(model))
    assert [s.name for s in compiled.inputs] == ["x"]
    rng = np.random.default_rng(1)
    inputs = [[rng.standard_normal((2, 8)).astype(np.float32)] for _ in range(2)]
    assert_matches_reference(compiled, ort_function(model), inputs, rtol=1e-4, atol=1e-5)


def test_from_torch_matches_torch():
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(self.fc2(torch.nn.functional.gelu(self.fc1(x))))

    torch.manual_seed(0)
    module = Block().eval()
    x = torch.randn(4, 16)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, (x,)))
    inputs = [[x.numpy()], [torch.randn(4, 16).numpy()]]
    assert_matches_reference(compiled, torch_function(module), inputs, rtol=1e-4, atol=1e-5)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"nope\.onnx: no such file"):
        aicf_tvm.from_onnx(tmp_path / "nope.onnx")


def test_file_that_is_not_onnx_names_it(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x00\x01 definitely not protobuf")
    with pytest.raises(UnsupportedModelError, match=r"junk\.onnx: not an ONNX model"):
        load_model(path)


def test_unsupported_operator_names_op_and_node():
    with pytest.raises(UnsupportedModelError, match=r"operator FancyOp \(node mystery_node\)"):
        aicf_tvm.from_onnx(unsupported_op_model())


def test_unknown_model_spec_lists_the_built_ins():
    with pytest.raises(UnsupportedModelError, match=r"not a built-in model \(.*encoder_layer"):
        load_model("no_such_model")


# --- PyTorch: PyTorch's type promotion, negative indices ---------------------------------


def _torch_matches(module, *args, exact: bool = False) -> None:
    """Import ``module`` with ``from_torch``, compile it, and compare every output (dtype too)
    with PyTorch eager."""
    torch = pytest.importorskip("torch")
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, args))
    with torch.no_grad():
        want = module(*args)
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    got = compiled(*[a.numpy() for a in args])
    got = got if isinstance(got, list) else [got]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_cumsum_of_a_bool_mask_sums_in_int64():
    """transformers' packed-sequence check: ``(diff != 1).cumsum(-1)``, then ``== 0``; TVM's
    frontend summed the bool as bool and LLVM refused the add."""
    torch = pytest.importorskip("torch")

    class PackedSequences(torch.nn.Module):
        def forward(self, pos):
            diff = pos[:, 1:] - pos[:, :-1]
            seq = (diff != 1).cumsum(-1)
            return seq, seq == 0, (diff > 0).cumprod(-1), (diff > 0).sum(-1)

    _torch_matches(PackedSequences(), torch.tensor([[0, 1, 2, 5, 6, 0, 1, 2]]), exact=True)


def test_true_division_of_integers_gives_float():
    """DeBERTa's ``log(abs_pos / mid)`` on int64 tensors; an int tensor times 0.5 (the scalar
    was cast to int); a float32 tensor times a float64 0-dim buffer stays float32."""
    torch = pytest.importorskip("torch")

    class IntMath(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.tensor(0.3, dtype=torch.float64))

        def forward(self, a, b, x):
            return torch.log(a / b), a * 0.5, torch.sqrt(a), x * self.scale

    rng = np.random.default_rng(5)
    a, b = rng.integers(1, 50, (3, 4)), rng.integers(1, 9, (3, 4))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    _torch_matches(IntMath(), torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(x))


def test_comparison_of_an_int_tensor_with_a_float_compares_in_float():
    torch = pytest.importorskip("torch")

    class Compare(torch.nn.Module):
        def forward(self, a, m):
            return a == 0.5, a < 1.5, a >= torch.tensor(1.5), m == (a > 0)

    a = torch.tensor([[0, 1, 2, 3]])
    _torch_matches(Compare(), a, torch.tensor([[True, False, True, True]]), exact=True)


def test_descending_aranges_of_constant_bounds_import_and_match_pytorch():
    """Relax typed ``arange(6, -1, -1)`` with 9 elements: the sum with the 7-element input
    failed in TVM's translator."""
    torch = pytest.importorskip("torch")

    class Reversed(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(6, -1, -1, dtype=torch.float32), torch.arange(7, 0, -3) * 2

    x = torch.from_numpy(np.random.default_rng(9).standard_normal(7).astype(np.float32))
    _torch_matches(Reversed(), x, exact=True)


def test_negative_indices_count_from_the_end():
    """Falcon's ``fused_qkv[..., [-2], :]`` (a constant index), and tensor indices with
    negative values through advanced indexing and ``torch.take``."""
    torch = pytest.importorskip("torch")

    class Indexing(torch.nn.Module):
        def forward(self, qkv, rows, cols):
            return qkv[..., [-2], :], qkv[0, rows], qkv[0, rows, cols], torch.take(qkv, rows)

    rng = np.random.default_rng(6)
    qkv = torch.from_numpy(rng.standard_normal((2, 5, 6, 3)).astype(np.float32))
    rows, cols = torch.tensor([-1, 0, -5, 3]), torch.tensor([-6, 5, 0, -1])
    _torch_matches(Indexing(), qkv, rows, cols, exact=True)


def test_tiny_gpt2_without_a_mask_matches_torch():
    """A real decoder traces the bool cumsum when called without a mask."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=16, bos_token_id=1,
                                  eos_token_id=2)
    model = transformers.GPT2Model(cfg).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).last_hidden_state

    ids = torch.from_numpy(np.random.default_rng(7).integers(3, 50, (1, 6)))
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(LastHidden(), (ids,)))
    with torch.no_grad():
        want = LastHidden()(ids).numpy()
    np.testing.assert_allclose(compiled(ids.numpy()), want, rtol=1e-4, atol=1e-5)


def test_cat_skips_empty_one_dimensional_inputs_as_pytorch_does():
    """``torch.cat([torch.empty(0), x], -2)``: PyTorch skips the (0,)-shaped input whatever
    x's rank; TVM's concat needs one rank."""
    torch = pytest.importorskip("torch")

    class Cache(torch.nn.Module):
        def forward(self, x, y):
            past = torch.empty(0, dtype=x.dtype)
            return torch.cat([past, x], dim=-2), torch.cat([x, past, y], dim=-2)

    rng = np.random.default_rng(8)
    x, y = (torch.from_numpy(rng.standard_normal((1, 2, 3, 4)).astype(np.float32)) for _ in range(2))
    _torch_matches(Cache(), x, y, exact=True)


def test_tiny_gpt2_called_as_the_docs_call_it_matches_torch():
    """The default cache (an empty key/value concatenated with the first step's) and the
    all-ones mask a tokenizer returns."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=16)
    model = transformers.GPT2Model(cfg).eval()

    rng = np.random.default_rng(9)
    ids, other = (torch.from_numpy(rng.integers(0, 50, (1, 6))) for _ in range(2))
    mask = torch.ones((1, 6), dtype=torch.int64)
    wrapped = last_hidden_state(model)
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(wrapped, (ids, mask)))
    with torch.no_grad():
        want, other_want = wrapped(ids, mask).numpy(), wrapped(other, mask).numpy()
    assert not np.allclose(want, other_want)
    np.testing.assert_allclose(compiled(ids.numpy(), mask.numpy()), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(compiled(other.numpy(), mask.numpy()), other_want, rtol=1e-4, atol=1e-5)


# --- ONNX: shape subgraphs folded, dynamic dims ------------------------------------------


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _graph(nodes, inputs, inits, outputs=("y",)) -> onnx.ModelProto:
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", info, outs, inits),
                             opset_imports=[helper.make_opsetid("", 17)])


COMPUTED_PADS = _graph(  # MobileNetV2/EfficientNet's "same" padding, computed from the input shape
    [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i3"], ["w"], axis=0),
     helper.make_node("Sub", ["eight", "w"], ["extra"]),
     helper.make_node("Concat", ["zeros", "extra", "zeros", "extra"], ["pads"], axis=0),
     helper.make_node("Pad", ["x", "pads"], ["y"])],
    [("x", [1, 2, 5, 5])], [_ints("i3", [3]), _ints("eight", [8]), _ints("zeros", [0, 0, 0])])

RESHAPE_OF_A_RESHAPE = _graph(  # Swin's window partition: the second reshape's input lost its shape
    [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i1"], ["c"], axis=0),
     helper.make_node("Div", ["c", "two"], ["half"]),
     helper.make_node("Concat", ["one", "half", "two", "m1"], ["t"], axis=0),
     helper.make_node("Reshape", ["x", "t"], ["r"]), helper.make_node("Transpose", ["r"], ["rt"], perm=[0, 2, 1, 3]),
     helper.make_node("Shape", ["rt"], ["s2"]), helper.make_node("Slice", ["s2", "zero", "one"], ["b"]),
     helper.make_node("Concat", ["b", "m1"], ["t2"], axis=0), helper.make_node("Reshape", ["rt", "t2"], ["y"])],
    [("x", [1, 6, 4])], [_ints("i1", [1]), _ints("two", [2]), _ints("one", [1]), _ints("m1", [-1]),
                         _ints("zero", [0])])

CONSTANT_OF_COMPUTED_SHAPE = _graph(
    [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i1"], ["n"], axis=0),
     helper.make_node("ConstantOfShape", ["n"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
     helper.make_node("Add", ["x", "ones"], ["y"])],
    [("x", [2, 3])], [_ints("i1", [1])])

EXPAND_TO_A_LOWER_RANK_SHAPE = _graph(  # decoders' masks: Expand broadcasts both ways
    [helper.make_node("Shape", ["v"], ["s"]), helper.make_node("Expand", ["x", "s"], ["y"])],
    [("x", [1, 4]), ("v", [4])], [])


@pytest.mark.parametrize("model", [COMPUTED_PADS, RESHAPE_OF_A_RESHAPE, CONSTANT_OF_COMPUTED_SHAPE,
                                   EXPAND_TO_A_LOWER_RANK_SHAPE],
                         ids=["computed_pads", "reshape_of_a_reshape", "constant_of_computed_shape",
                              "expand_to_lower_rank"])
def test_shape_subgraphs_fold_and_match_onnxruntime(model):
    """TVM's ONNX frontend alone stops on each (dynamic pads, a reshape of a shapeless
    tensor, ConstantOfShape of a computed shape, Expand's rank assertion)."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(8)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = aicf_tvm.compile(aicf_tvm.from_onnx(model))(**feeds)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


DYNAMIC = _graph([helper.make_node("Add", ["a", "b"], ["y"]), helper.make_node("Neg", ["c"], ["z"])],
                 [("a", ["batch", 4]), ("b", ["batch", 4]), ("c", [None, 4])], [], outputs=("y", "z"))


def test_named_dims_share_one_var_and_unnamed_dims_get_their_own():
    params = aicf_tvm.from_onnx(DYNAMIC)["main"].params
    a, b, c = (p.ty.shape[0] for p in params)
    assert a.same_as(b) and a.name == "batch"
    assert not c.same_as(a) and c.name == "c_dim0"


def test_dynamic_dims_run_at_any_size_like_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(9)
    feeds = {"a": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal((3, 4)).astype(np.float32),
             "c": rng.standard_normal((5, 4)).astype(np.float32)}
    want = ort.InferenceSession(DYNAMIC.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = aicf_tvm.compile(aicf_tvm.from_onnx(DYNAMIC))(**feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_shapes_pin_an_input_and_must_name_one():
    params = aicf_tvm.from_onnx(DYNAMIC, shapes={"a": [2, 4], "b": [2, 4]})["main"].params
    assert [int(d) for d in params[0].ty.shape] == [2, 4] and not isinstance(params[2].ty.shape[0], int)
    with pytest.raises(UnsupportedModelError, match=r"shapes= names nope, not an input; the inputs are: a, b, c"):
        aicf_tvm.from_onnx(DYNAMIC, shapes={"nope": [1]})
    with pytest.raises(UnsupportedModelError, match=r"input a has rank 2, shapes= gives \[2\]"):
        aicf_tvm.from_onnx(DYNAMIC, shapes={"a": [2]})


def test_shapes_name_or_keep_dims_and_bounds_bound_them():
    """A name in ``shapes=`` makes the dim symbolic (one var per name, shared with the
    model's own names), ``?`` keeps the model's dim, ``bounds=`` becomes the bounds the
    compiled model checks; a bound on no dim of the model names the ones there are."""
    mod = aicf_tvm.from_onnx(DYNAMIC, shapes={"a": ["n", "?"], "b": ["n", 4], "c": ["batch", "?"]},
                             bounds={"n": (1, 8)})
    a, b, c = (p.ty.shape[0] for p in mod["main"].params)
    assert a.same_as(b) and a.name == "n" and c.name == "batch" and not c.same_as(a)
    compiled = aicf_tvm.compile(mod)
    assert compiled.dim_bounds == {"n": [1, 8]} and compiled.inputs[0].shape == ("n", 4)
    rng = np.random.default_rng(14)
    x, y, z = (rng.standard_normal(shape).astype(np.float32) for shape in ((3, 4), (3, 4), (2, 4)))
    got = compiled(a=x, b=y, c=z)
    np.testing.assert_array_equal(got[0], x + y)
    np.testing.assert_array_equal(got[1], -z)
    with pytest.raises(aicf_tvm.InputError, match=r"dim n = 9 is outside its bounds \[1, 8\]"):
        compiled(a=np.zeros((9, 4), np.float32), b=np.zeros((9, 4), np.float32), c=z)
    with pytest.raises(aicf_tvm.InputError, match=r"dim seq: not a symbolic dim of the model \(its symbolic "
                                                  r"dims are: batch, c_dim0\)"):
        aicf_tvm.from_onnx(DYNAMIC, bounds={"seq": (1, 8)})


def test_bool_arithmetic_and_comparisons_compute_on_zero_and_one():
    """TVM's LLVM codegen has no bool add or compare: ``mask + mask`` is a logical or,
    ``mask * mask`` an and, ``max`` an or, ``mask < mask`` an order on False < True."""
    torch = pytest.importorskip("torch")

    class MaskMath(torch.nn.Module):
        def forward(self, m, n):
            return m + n, m * n, torch.maximum(m, n), m < n, m == n, torch.where(m, m, n)

    m, n = torch.tensor([[False, True, False, True]]), torch.tensor([[False, False, True, True]])
    _torch_matches(MaskMath(), m, n, exact=True)
