"""Fuzz regression fuzz_dcaf83f713: [error] InternalError: LLVM module verification failed with the following errors: 

Found by ``python -m scripts.fuzz --seed 5005 --profile all``; the shrunk program:

    family='graph', inputs=[((4,), 'float32')], n=3, specials=()
      v1 = slice_scatter(0,) {'axis': 0, 'begin': 0, 'end': 1}
      outputs=(1,)
"""

import numpy as np
import tvm

from tests.fuzz.check import check_module
from tests.fuzz.program import make_input

SOURCE = r'''# from tvm.script import ir as I
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x0: R.Tensor((4,), dtype="float32")) -> R.Tensor((4,), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1,), dtype="float32") = R.strided_slice(x0, (0,), (0,), (1,), (1,), assume_inbound=False)
            lv1: R.Tensor((1,), dtype="float32") = R.multiply(lv, R.const(2.0, "float32"))
            lv2: R.Tensor((4,), dtype="float32") = R.slice_scatter(x0, lv1, 0, 1, 1, axis=0)
            gv: R.Tensor((4,), dtype="float32") = lv2
            R.output(gv)
        return gv'''

INPUTS = [([4], 'float32', False)]  # (shape, dtype, with IEEE specials) of each input, drawn from default_rng(0)
DTYPES = ['float32']


def test_fuzz_dcaf83f713() -> None:
    mod = tvm.script.from_source(SOURCE)
    rng = np.random.default_rng(0)
    inputs = [make_input(rng, shape, dtype, special) for shape, dtype, special in INPUTS]
    check_module(mod, inputs, set(DTYPES))
