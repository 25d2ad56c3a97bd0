"""Fuzz regression fuzz_529a2d0dba: RuntimeError: integer modulo by zero

Found by ``python -m scripts.fuzz --seed 2026``; the shrunk program:

    inputs=[(('n',), 'float32')], n=1
      v1 = add(0,) {'swap': True, 'const': {'shape': [], 'seed': 0, 'fill': 'rand', 'dtype': 'float32'}}
      v2 = softmax(1,) {'axis': 0}
      outputs=(2,)
"""

import numpy as np
import tvm

from tests.fuzz.check import check_module

SOURCE = r'''# from typing import TypeVar
# from tvm.script import ir as I
# from tvm.script import relax as R

n = TypeVar("n")
@I.ir_module
class Module:
    @R.function
    def main(x0: R.Tensor((n,), dtype="float32")) -> R.Tensor((n,), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((n,), dtype="float32") = R.add(R.const(0.12573021650314331, "float32"), x0)
            lv1: R.Tensor((n,), dtype="float32") = R.nn.softmax(lv, axis=0)
            gv: R.Tensor((n,), dtype="float32") = lv1
            R.output(gv)
        return gv'''

INPUTS = [([1], 'float32')]  # (shape, dtype) of each input, filled from default_rng(0)
DTYPES = ['float32']


def test_fuzz_529a2d0dba() -> None:
    mod = tvm.script.from_source(SOURCE)
    rng = np.random.default_rng(0)
    inputs = [np.asarray(rng.standard_normal(shape)).astype(dtype) for shape, dtype in INPUTS]
    check_module(mod, inputs, set(DTYPES))
