"""CacheInPlace: a ``slice_scatter`` into a donated parameter writes the rows into the
caller's buffer (``call_tir_inplace``), and is refused, copying, when the caller does not
donate it or the function reads it elsewhere. Results against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import aicf_tvm
from aicf_tvm.core.kinds.cache import DONATED_INPUTS_ATTR


def module(read_again: bool = False) -> tvm.IRModule:
    """``new = slice_scatter(cache, rows, t - s, t, axis=1)`` and a sum over ``new[:, :t]``
    (``read_again``: over ``new`` plus one over the old ``cache``); ``t`` is ``mark``'s length."""
    s, t = tirx.Var("s", "int64"), tirx.Var("t", "int64")
    cache = relax.Var("cache", relax.TensorType([2, 8, 4], "float32"))
    rows = relax.Var("rows", relax.TensorType([2, s, 4], "float32"))
    mark = relax.Var("mark", relax.TensorType([t], "int64"))
    op = relax.op
    bb = relax.BlockBuilder()
    with bb.function("main", [cache, rows, mark], attrs={"tir_var_upper_bound": {"s": 8, "t": 8}}):
        with bb.dataflow():
            new = bb.emit(op.slice_scatter(cache, rows, t - s, t, 1, axis=1))
            if read_again:
                total = bb.emit(op.add(op.sum(new, axis=[1]), op.sum(cache, axis=[1])))
            else:
                head = bb.emit(op.strided_slice(new, axes=[1], begin=[0], end=[t], assume_inbound=True))
                total = bb.emit(op.sum(head, axis=[1]))
            out = bb.emit_output(relax.Tuple([new, total]))
        bb.emit_func_output(out)
    return bb.get()


def reference(cache: np.ndarray, rows: np.ndarray, t: int, read_again: bool):
    new = cache.copy()
    new[:, t - rows.shape[1]:t] = rows
    total = new.sum(axis=1) + cache.sum(axis=1) if read_again else new[:, :t].sum(axis=1)
    return new, total


def run(compiled, cache: np.ndarray, rows: np.ndarray, t: int):
    buf = tvm.runtime.tensor(cache)
    out = compiled.function("main")(buf, tvm.runtime.tensor(rows), tvm.runtime.tensor(np.zeros(t, np.int64)))
    return buf, out


@pytest.mark.parametrize("donate", [True, False])
def test_donated_cache_is_written_in_place(donate):
    mod = module()
    if donate:
        mod["main"] = mod["main"].with_attr(DONATED_INPUTS_ATTR, ["cache"])
    compiled = aicf_tvm.compile(mod)
    [decision] = [d for d in compiled.report.decisions if d.candidate == "cache_write"]
    assert decision.accepted == donate
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((2, 8, 4)).astype(np.float32)
    rows = rng.standard_normal((2, 3, 4)).astype(np.float32)
    want_new, want_total = reference(cache, rows, 5, False)
    buf, out = run(compiled, cache, rows, 5)
    np.testing.assert_array_equal(out[0].numpy(), want_new)
    np.testing.assert_allclose(out[1].numpy(), want_total, rtol=1e-6)
    if donate:
        assert "0 cache bytes copied" in decision.note
        np.testing.assert_array_equal(buf.numpy(), want_new)  # the caller's buffer holds the rows
    else:
        assert "does not donate cache" in decision.note and "copies 256 B" in decision.note
        np.testing.assert_array_equal(buf.numpy(), cache)  # left as it was


def test_a_cache_read_elsewhere_is_not_written():
    mod = module(read_again=True)
    mod["main"] = mod["main"].with_attr(DONATED_INPUTS_ATTR, ["cache"])
    compiled = aicf_tvm.compile(mod)
    [decision] = [d for d in compiled.report.decisions if d.candidate == "cache_write"]
    assert not decision.accepted and "read elsewhere" in decision.note
    rng = np.random.default_rng(1)
    cache = rng.standard_normal((2, 8, 4)).astype(np.float32)
    rows = rng.standard_normal((2, 2, 4)).astype(np.float32)
    buf, out = run(compiled, cache, rows, 8)
    want_new, want_total = reference(cache, rows, 8, True)
    np.testing.assert_array_equal(out[0].numpy(), want_new)
    np.testing.assert_allclose(out[1].numpy(), want_total, rtol=1e-5)
    np.testing.assert_array_equal(buf.numpy(), cache)


def test_rows_past_the_cache_are_refused_before_any_kernel_runs():
    mod = module()
    mod["main"] = mod["main"].with_attr(DONATED_INPUTS_ATTR, ["cache"])
    compiled = aicf_tvm.compile(mod)
    rng = np.random.default_rng(2)
    cache = rng.standard_normal((2, 8, 4)).astype(np.float32)
    with pytest.raises(aicf_tvm.InputError):  # t - s < 0: rows would start before the cache
        compiled(cache, rng.standard_normal((2, 4, 4)).astype(np.float32), np.zeros(3, np.int64))
