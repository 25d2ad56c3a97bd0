"""A check of TVM's failing on a model's graph is the model refused by name of the phase
(``pipeline._Clock``); in the kernel phases it stays TVM's own error (our schedules' bugs)."""

from __future__ import annotations

import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

import aicf_tvm
from aicf_tvm.driver import pipeline


@I.ir_module
class Add:
    @R.function
    def main(x: R.Tensor((4,), "float32")):
        with R.dataflow():
            y = R.add(x, x)
            R.output(y)
        return y


def _failing(*args, **kwargs):
    raise tvm.error.InternalError("Check failed: (y != kNegInf) is false:")


def test_a_tvm_check_failing_on_the_graph_is_an_unsupported_model(monkeypatch):
    monkeypatch.setattr(pipeline, "optimize", _failing)
    with pytest.raises(aicf_tvm.UnsupportedModelError,
                       match=r"TVM failed while compiling the model \(fuse\): Check failed: \(y != kNegInf\)"):
        aicf_tvm.compile(Add)


def test_a_tvm_check_failing_in_the_kernels_stays_tvms(monkeypatch):
    monkeypatch.setattr(pipeline, "build", _failing)
    with pytest.raises(tvm.error.InternalError):
        aicf_tvm.compile(Add)
