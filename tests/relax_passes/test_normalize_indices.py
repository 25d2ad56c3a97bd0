"""NormalizeIndices: every take/gather reads in bounds or raises, negative indices count from
the end.

References are numpy's own indexing (``np.take``, ``np.take_along_axis``, advanced
indexing), which defines negative indices as PyTorch and ONNX do and raises ``IndexError``
on any other index (as ONNX Runtime and PyTorch do).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

import aicf_tvm
from aicf_tvm import InputError, UnsupportedModelError
from relax_passes.index_checks import CHECK_ATTR
from relax_passes.normalize_indices import NormalizeIndices, resolve_constant

from ..conftest import run_vm


def test_resolve_constant_maps_negative_indices_from_the_end():
    got = resolve_constant(np.array([-1, 0, -5, 4], dtype="int64"), [5], "fast", "take")
    np.testing.assert_array_equal(got, [4, 0, 0, 4])
    assert got.dtype == np.int64


def test_resolve_constant_applies_clip_and_wrap_modes():
    values = np.array([-7, 2, 9], dtype="int32")
    np.testing.assert_array_equal(resolve_constant(values, [5], "clip", "take"), [0, 2, 4])
    np.testing.assert_array_equal(resolve_constant(values, [5], "wrap", "take"), [3, 2, 4])


def test_resolve_constant_wraps_each_coordinate_of_gather_nd():
    got = resolve_constant(np.array([[-1, -1], [1, 2]], dtype="int64"), [4, 3], "fast", "gather_nd")
    np.testing.assert_array_equal(got, [[3, 2], [1, 2]])


def test_constant_index_out_of_range_is_refused():
    with pytest.raises(UnsupportedModelError, match=r"take: constant index 5 is out of range for an axis of size 5"):
        resolve_constant(np.array([0, 5]), [5], "fast", "take")


@I.ir_module
class TakeNegativeConstant:
    @R.function
    def main(x: R.Tensor((4, 6), "float32")):
        with R.dataflow():
            y = R.take(x, R.const(np.array([-2], "int64"), "int64"), axis=1, mode="fast")
            R.output(y)
        return y


@I.ir_module
class TakeFoldedConstant:
    @R.function
    def main(x: R.Tensor((4, 6), "float32")):
        with R.dataflow():
            y = R.take(x, R.const(np.array([4], "int64"), "int64"), axis=1, mode="clip")
            R.output(y)
        return y


def test_negative_constant_index_is_folded_at_compile_time():
    """Falcon's ``qkv[..., [-2], :]``: the index becomes n - 2, read in clip mode (on an index
    in range the same element as fast, without TVM's warning that fast reads out of bounds)."""
    got = NormalizeIndices()(TakeNegativeConstant)
    tvm.ir.assert_structural_equal(got, TakeFoldedConstant)
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    np.testing.assert_array_equal(run_vm(got, x)[0], x[:, [-2]])


def test_in_range_constant_is_unchanged_and_the_pass_is_idempotent():
    once = NormalizeIndices()(TakeFoldedConstant)
    tvm.ir.assert_structural_equal(once, TakeFoldedConstant)
    tvm.ir.assert_structural_equal(NormalizeIndices()(once), once)


@I.ir_module
class TakeDynamic:
    @R.function
    def main(x: R.Tensor((5, 3), "float32"), i: R.Tensor((4,), "int64")):
        with R.dataflow():
            y = R.take(x, i, axis=0)
            z = R.take(x, i, axis=0, mode="nan")
            R.output(y, z)
        return y, z


def _checks(mod: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in mod.functions_items()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and CHECK_ATTR in f.attrs]


def test_dynamic_take_is_checked_and_nan_mode_stays():
    got = NormalizeIndices()(TakeDynamic)
    modes = [str(b.value.attrs.mode) for b in got["main"].body.blocks[0].bindings
             if getattr(b.value.op, "name", "") == "relax.take"]
    assert modes == ["clip", "nan"] and len(_checks(got)) == 1
    rng = np.random.default_rng(1)
    x, i = rng.standard_normal((5, 3)).astype("float32"), np.array([-1, 2, -5, 4])
    np.testing.assert_array_equal(run_vm(got, x, i)[0], x[i])


@pytest.mark.parametrize("bad", [5, -6, 10**9, -(2**40)])
def test_dynamic_take_of_an_index_out_of_range_raises_naming_it(bad):
    """numpy (like ONNX Runtime) raises on an index outside [-5, 5); so does the module,
    naming the input, the index, its position and the bound (it read a wrong row, wrapped)."""
    rng = np.random.default_rng(7)
    x, i = rng.standard_normal((5, 3)).astype("float32"), np.array([0, 1, bad, 2])
    with pytest.raises(IndexError):
        np.take(x, i, axis=0)
    got = NormalizeIndices()(TakeDynamic)
    with pytest.raises(InputError, match=rf"input i: index {bad} at \[2\] is out of range "
                                         r"\[-5, 5\) of take"):
        run_vm(got, x, i)


@I.ir_module
class Gathers:
    @R.function
    def main(x: R.Tensor((5, 4), "float32"), e: R.Tensor((2, 4), "int64"), nd: R.Tensor((3, 2), "int64"),
             r: R.Tensor((3,), "int64"), c: R.Tensor((3,), "int64")):
        with R.dataflow():
            ge = R.gather_elements(x, e, axis=0)
            gn = R.gather_nd(x, nd)
            it = R.index_tensor(x, (r, c))
            R.output(ge, gn, it)
        return ge, gn, it


def test_gathers_with_negative_dynamic_indices_match_numpy():
    got = NormalizeIndices()(Gathers)
    tvm.ir.assert_structural_equal(NormalizeIndices()(got), got)  # checked ones are not again
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 4)).astype("float32")
    e = rng.integers(-5, 5, (2, 4))
    nd = np.stack([rng.integers(-5, 5, 3), rng.integers(-4, 4, 3)], axis=1)
    r, c = rng.integers(-5, 5, 3), rng.integers(-4, 4, 3)
    ge, gn, it = run_vm(got, x, e, nd, r, c)
    np.testing.assert_array_equal(ge, np.take_along_axis(x, e, axis=0))
    np.testing.assert_array_equal(gn, x[nd[:, 0], nd[:, 1]])
    np.testing.assert_array_equal(it, x[r, c])


@pytest.mark.parametrize("which, bad, message", [
    (0, (1, 2, 5), r"input e: index 5 at \[1, 2\] is out of range \[-5, 5\) of gather_elements"),
    (1, (2, 1, -5), r"input nd: index -5 at \[2, 1\] is out of range \[-4, 4\) of gather_nd"),
    (3, (0, 4), r"input c: index 4 at \[0\] is out of range \[-4, 4\) of index_tensor on axis 1"),
])
def test_gathers_of_an_index_out_of_range_raise_naming_it(which, bad, message):
    """numpy raises on each; gather_nd checks each coordinate against its own axis."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((5, 4)).astype("float32")
    args = [rng.integers(-4, 4, shape) for shape in ((2, 4), (3, 2), 3, 3)]
    args[which][bad[:-1]] = bad[-1]
    e, nd, r, c = args
    with pytest.raises(IndexError):
        (np.take_along_axis(x, e, axis=0), x[nd[:, 0], nd[:, 1]], x[r, c])
    with pytest.raises(InputError, match=message):
        run_vm(NormalizeIndices()(Gathers), x, e, nd, r, c)


def test_symbolic_extent_checks_by_the_run_time_size():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 3), "float32"))
    e = relax.Var("e", relax.TensorType((2, 3), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, e]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.gather_elements(x, e, axis=0))
        bb.emit_func_output(out)
    got = NormalizeIndices()(bb.get())
    rng = np.random.default_rng(3)
    xs, es = rng.standard_normal((6, 3)).astype("float32"), rng.integers(-6, 6, (2, 3))
    np.testing.assert_array_equal(run_vm(got, xs, es)[0], np.take_along_axis(xs, es, axis=0))
    es[1, 1] = 6
    with pytest.raises(InputError, match=r"index 6 at \[1, 1\] is out of range \[-6, 6\)"):
        run_vm(got, xs, es)


def test_compile_normalizes_modules_from_any_source():
    """``compile``'s normalize runs the pass: a fast take of negative indices built by hand."""
    rng = np.random.default_rng(4)
    x, i = rng.standard_normal((5, 3)).astype("float32"), np.array([-1, -3, 0, 2])
    compiled = aicf_tvm.compile(TakeDynamic)
    np.testing.assert_array_equal(compiled(x, i)[0], x[i])


def _scatter_module(data_shape, index_shape, axis):
    x = relax.Var("x", relax.TensorType(data_shape, "float32"))
    u = relax.Var("u", relax.TensorType(index_shape, "float32"))
    i = relax.Var("i", relax.TensorType(index_shape, "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, i, u]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.scatter_elements(x, i, u, axis=axis))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("data_shape, index_shape, axis", [
    ((4, 2, 3), (1, 2, 1), 0), ((1, 5), (1, 1), 0), ((4, 1), (1, 1), 1), ((5, 4, 3), (2, 3, 2), 1),
    ((5, 4, 3), (2, 1, 3), -1),
])
def test_scatter_elements_with_indices_narrower_than_the_data_matches_numpy(data_shape, index_shape, axis):
    """TVM's kernel put update (0, 1, 0) of a [1, 2, 1] update into data[i, 0, 1] of a
    [4, 2, 3] tensor; the scatter now runs on the region the indices cover (ONNX's
    ScatterElements: update ``p`` goes to ``p`` with ``p[axis]`` replaced by its index)."""
    rng = np.random.default_rng(12)
    data = rng.standard_normal(data_shape).astype("float32")
    upd = rng.standard_normal(index_shape).astype("float32")
    n = data_shape[axis]
    idx = rng.integers(-n, n, size=index_shape).astype("int64")
    compiled = aicf_tvm.compile(_scatter_module(data_shape, index_shape, axis),
                                target={"kind": "llvm", "num-cores": 2})
    want = data.copy()
    for p in np.ndindex(*index_shape):
        q = list(p)
        q[axis] = idx[p] % n
        want[tuple(q)] = upd[p]
    np.testing.assert_array_equal(compiled(data, idx, upd), want)


def test_scatter_elements_spanning_the_other_axes_matches_numpy():
    rng = np.random.default_rng(11)
    data, upd = rng.standard_normal((4, 2, 3)).astype("float32"), rng.standard_normal((2, 2, 3)).astype("float32")
    idx = np.stack([rng.permutation(4)[:2] for _ in range(6)], axis=1).reshape(2, 2, 3).astype("int64")
    compiled = aicf_tvm.compile(_scatter_module((4, 2, 3), (2, 2, 3), 0), target={"kind": "llvm", "num-cores": 2})
    want = data.copy()
    for a, b, c in np.ndindex(2, 2, 3):
        want[idx[a, b, c], b, c] = upd[a, b, c]
    np.testing.assert_array_equal(compiled(data, idx, upd), want)


def _arange_mask_module(row_end_offset: int) -> tvm.IRModule:
    """``mask[arange(b)[:, None], arange(s + offset)[None, :]]`` on a ``[b, s]`` mask, the
    indexing PyTorch's attention-mask builders emit (the column arange through ``+ 0`` and
    expand_dims, as exported)."""
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    mask = relax.Var("mask", relax.TensorType((b, s), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [mask]):
        with bb.dataflow():
            rows = bb.emit(relax.op.expand_dims(relax.op.arange(0, b, 1, "int64"), [1]))
            cols = bb.emit(relax.op.arange(0, s + row_end_offset, 1, "int64"))
            cols = bb.emit(relax.op.expand_dims(relax.op.add(cols, relax.const(0, "int64")), [0]))
            out = bb.emit_output(relax.op.index_tensor(mask, relax.Tuple([rows, cols])))
        bb.emit_func_output(out)
    return bb.get()


def _count_calls(mod: tvm.IRModule, op_name: str) -> int:
    found = []
    relax.analysis.post_order_visit(
        mod["main"], lambda e: found.append(isinstance(e, relax.Call) and getattr(e.op, "name", "") == op_name))
    return sum(found)


def test_arange_indices_within_the_axis_are_not_checked():
    """``arange(0, m, 1)`` holds 0..m-1: in bounds of an axis of m, through views and + 0."""
    got = NormalizeIndices()(_arange_mask_module(0))
    assert _count_calls(got, "relax.call_tir") == 0
    rng = np.random.default_rng(5)
    for shape in [(1, 1), (2, 7), (3, 16)]:
        mask = rng.standard_normal(shape).astype("float32")
        np.testing.assert_array_equal(run_vm(got, mask)[0], mask)


def test_arange_past_the_axis_is_checked():
    """``arange(0, s + 1)`` on an axis of s reaches index s: it is checked, and raises."""
    got = NormalizeIndices()(_arange_mask_module(1))
    assert _count_calls(got, "relax.call_tir") == 1
    with pytest.raises(InputError, match=r"index 3 at \[3\] is out of range \[-3, 3\) of "
                                         r"index_tensor on axis 1 of a float32 \[b, s\]"):
        run_vm(got, np.zeros((2, 3), "float32"))


def _take_module(index_dtype: str, cast_to: str | None = None,
                 onnx_from_end: bool = False) -> tvm.IRModule:
    """``take(x, i)`` on a [5, 3] table, the indices cast to ``cast_to`` first (TVM's PyTorch
    frontend casts token ids to int32) or counted from the end as ONNX's frontend does."""
    x = relax.Var("x", relax.TensorType((5, 3), "float32"))
    i = relax.Var("i", relax.TensorType((4,), index_dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, i]):
        with bb.dataflow():
            idx = bb.emit(relax.op.astype(i, cast_to)) if cast_to else i
            if onnx_from_end:
                zero, n = relax.const(0, index_dtype), relax.const(5, index_dtype)
                idx = bb.emit(relax.op.where(relax.op.less(idx, zero), relax.op.add(idx, n), idx))
            out = bb.emit_output(relax.op.take(x, idx, axis=0))
        bb.emit_func_output(out)
    return bb.get()


def test_indices_are_checked_before_a_narrowing_cast():
    """Id 2**32 + 1 cast to int32 is 1: checked after the cast it would read row 1; numpy
    (and PyTorch, which takes the int64 ids) refuse it, so does the module."""
    rng = np.random.default_rng(9)
    x, i = rng.standard_normal((5, 3)).astype("float32"), np.array([0, 2**32 + 1, 2, -1])
    with pytest.raises(IndexError):
        np.take(x, i, axis=0)
    got = NormalizeIndices()(_take_module("int64", "int32"))
    with pytest.raises(InputError, match=r"input i: index 4294967297 at \[1\] is out of range "
                                         r"\[-5, 5\)"):
        run_vm(got, x, i)
    i[1] = 3
    np.testing.assert_array_equal(run_vm(got, x, i)[0], x[i])


def test_onnx_count_from_the_end_is_checked_on_its_source():
    """ONNX's ``where(i < 0, i + n, i)`` maps -7 to -2; checked there, -2 would count from
    the end again and read row 3. ONNX Runtime refuses -7 (numpy too): so does the module."""
    rng = np.random.default_rng(10)
    x, i = rng.standard_normal((5, 3)).astype("float32"), np.array([0, -7, 2, -1])
    with pytest.raises(IndexError):
        np.take(x, i, axis=0)
    got = NormalizeIndices()(_take_module("int64", onnx_from_end=True))
    dead = relax.transform.DeadCodeElimination()(got)
    assert _count_calls(dead, "relax.where") == 0  # the check counts from the end itself
    with pytest.raises(InputError, match=r"input i: index -7 at \[1\] is out of range \[-5, 5\)"):
        run_vm(got, x, i)
    i[1] = -5
    np.testing.assert_array_equal(run_vm(got, x, i)[0], x[i])


def test_without_from_end_a_negative_index_is_out_of_range():
    """``NormalizeIndices(from_end=False)``: PyTorch's embedding refuses id -1."""
    rng = np.random.default_rng(11)
    x, i = rng.standard_normal((5, 3)).astype("float32"), np.array([0, 1, -1, 4])
    got = NormalizeIndices(from_end=False)(_take_module("int64"))
    with pytest.raises(InputError, match=r"input i: index -1 at \[2\] is out of range \[0, 5\)"):
        run_vm(got, x, i)
    i[2] = 3
    np.testing.assert_array_equal(run_vm(got, x, i)[0], x[i])


def test_indices_checked_for_a_longer_axis_are_checked_again():
    """Indices checked against 5 rows are not proven in range of a 3-row table."""
    x = relax.Var("x", relax.TensorType((5, 2), "float32"))
    y = relax.Var("y", relax.TensorType((3, 2), "float32"))
    i = relax.Var("i", relax.TensorType((2,), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y, i]):
        with bb.dataflow():
            a = bb.emit(relax.op.take(x, i, axis=0))
            b = bb.emit(relax.op.take(y, i, axis=0))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    got = NormalizeIndices()(bb.get())
    assert _count_calls(got, "relax.call_tir") == 2
    rng = np.random.default_rng(12)
    xs, ys = (rng.standard_normal(shape).astype("float32") for shape in ((5, 2), (3, 2)))
    with pytest.raises(InputError, match=r"index 4 at \[1\] is out of range \[-3, 3\) of take "
                                         r"along axis 0"):
        run_vm(got, xs, ys, np.array([0, 4]))


def _take_of_cast_constant(values: np.ndarray) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((5, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            i = bb.emit(relax.op.astype(relax.const(values, "int64"), "int32"))
            out = bb.emit_output(relax.op.take(x, i, axis=0))
        bb.emit_func_output(out)
    return bb.get()


def test_constant_indices_behind_a_cast_are_decided_at_compile_time():
    """Importers run NormalizeIndices before FoldConstant: indices still a cast of a constant
    are checked now, not by a kernel at every call; out of range is refused as a constant."""
    got = NormalizeIndices()(_take_of_cast_constant(np.array([1, -2, 4])))
    assert _count_calls(got, "relax.call_tir") == 0
    x = np.random.default_rng(13).standard_normal((5, 3)).astype("float32")
    np.testing.assert_array_equal(run_vm(got, x)[0], x[[1, -2, 4]])
    with pytest.raises(UnsupportedModelError, match=r"take along axis 0 of a float32 \[5, 3\] "
                                                    r"tensor: constant index 7 at \[2\] is out "
                                                    r"of range \[-5, 5\)"):
        NormalizeIndices()(_take_of_cast_constant(np.array([1, -2, 7])))


def _scatters() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((4, 3), "float32"))
    e = relax.Var("e", relax.TensorType((2, 3), "int64"))
    nd = relax.Var("nd", relax.TensorType((2, 2), "int64"))
    r = relax.Var("r", relax.TensorType((2,), "int64"))
    u = relax.Var("u", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, e, nd, r, u]):
        with bb.dataflow():
            a = bb.emit(relax.op.scatter_elements(x, e, u, 0))
            column = bb.emit(relax.op.reshape(relax.op.strided_slice(u, [1], [0], [1]), [2]))
            b = bb.emit(relax.op.scatter_nd(x, nd, column))
            cols = relax.const(np.array([0, 2]), "int64")
            c = bb.emit(relax.op.index_put(x, relax.Tuple([r, cols]), column))
            out = bb.emit_output(relax.Tuple([a, b, c]))
        bb.emit_func_output(out)
    return bb.get()


def test_scatters_write_in_bounds_or_raise():
    """An index past the axis wrote past the data (a silently lost update, memory behind the
    tensor overwritten); numpy raises on it and counts [-n, 0) from the end as we do."""
    rng = np.random.default_rng(14)
    x, u = rng.standard_normal((4, 3)).astype("float32"), rng.standard_normal((2, 3)).astype("float32")
    e = np.stack([rng.permutation(4)[:2] for _ in range(3)], axis=1) - 2  # distinct per column
    nd, r = np.array([[0, -1], [-4, 2]]), np.array([3, -3])
    got = NormalizeIndices()(_scatters())
    a, b, c = run_vm(got, x, e, nd, r, u)
    want_a = x.copy()
    np.put_along_axis(want_a, e, u, axis=0)
    want_b, want_c = x.copy(), x.copy()
    want_b[nd[:, 0], nd[:, 1]] = u[:, 0]
    want_c[r, [0, 2]] = u[:, 0]
    for got_one, want in ((a, want_a), (b, want_b), (c, want_c)):
        np.testing.assert_array_equal(got_one, want)
    for which, value, message in [(0, 4, (r"input e: index 4 at \[1, 2\] is out of range \[-4, 4\) "
                                           r"of scatter_elements")),
                                  (1, -4, r"input nd: index -4 at \[1, 1\] is out of range \[-3, 3\)"),
                                  (2, 9, r"input r: index 9 at \[1\] is out of range \[-4, 4\)")]:
        args = [e.copy(), nd.copy(), r.copy()]
        args[which][(1, 2) if which == 0 else (1, 1) if which == 1 else (1,)] = value
        with pytest.raises(IndexError):
            np.zeros((4, 3))[tuple(args[1].T) if which == 1 else args[which]]
        with pytest.raises(InputError, match=message):
            run_vm(got, x, *args, u)
