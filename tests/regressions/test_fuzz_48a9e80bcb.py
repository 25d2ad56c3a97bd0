"""Fuzz regression fuzz_48a9e80bcb: Exception: InputError: input x1: shape [1], expected [] (np.ascontiguousarray made the rank-0 input rank 1; fixed in aicf_tvm/driver/compiled.py)

Found by ``tests/fuzz/test_differential.py`` (derandomized run); the shrunk program:

    inputs=[((2,), 'float32'), ((), 'float32')], n=3
      v2 = add(0, 1) {'swap': False}
      outputs=(2,)
"""

import numpy as np
import tvm

from tests.fuzz.check import check_module

SOURCE = r'''# from tvm.script import ir as I
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x0: R.Tensor((2,), dtype="float32"), x1: R.Tensor((), dtype="float32")) -> R.Tensor((2,), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((2,), dtype="float32") = R.add(x0, x1)
            gv: R.Tensor((2,), dtype="float32") = lv
            R.output(gv)
        return gv'''

INPUTS = [([2], 'float32'), ([], 'float32')]  # (shape, dtype) of each input, filled from default_rng(0)
DTYPES = ['float32']


def test_fuzz_48a9e80bcb() -> None:
    mod = tvm.script.from_source(SOURCE)
    rng = np.random.default_rng(0)
    inputs = [np.asarray(rng.standard_normal(shape)).astype(dtype) for shape, dtype in INPUTS]
    check_module(mod, inputs, set(DTYPES))
