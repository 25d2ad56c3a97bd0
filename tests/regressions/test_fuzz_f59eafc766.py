"""Fuzz regression fuzz_f59eafc766: [error] UnsupportedModelError: scatter_elements along axis 1 with indices of shape [1, 1] on data of shape [4, 1]: TVM's kernel places such updates wrongly unless the i

Found by ``python -m scripts.fuzz --seed 48 --profile all``; the shrunk program:

    family='indexing', inputs=[((4, 1), 'float16'), ((1, 1), 'float16')], n=3, specials=()
      v2 = scatter_elements(0, 1) {'indices': {'kind': 'along', 'shape': [1, 1], 'seed': 0, 'dims': [1], 'axis': 1, 'negative': False}, 'axis': 1, 'reduction': 'update'}
      outputs=(2,)
"""

import numpy as np
import tvm

from tests.fuzz.check import check_module
from tests.fuzz.program import make_input

SOURCE = r'''metadata = tvm.ir.load_json("""{
  \"root_index\": 13,
  \"nodes\": [
    {
      \"type\": \"ffi.String\",
      \"data\": \"ir.GenericConst\"
    },
    {
      \"type\": \"None\"
    },
    {
      \"type\": \"ir.PrimType\",
      \"data\": {
        \"span\": 1,
        \"dtype\": \"int64\"
      }
    },
    {
      \"type\": \"int\",
      \"data\": 1
    },
    {
      \"type\": \"ir.IntImm\",
      \"data\": {
        \"span\": 1,
        \"ty\": 2,
        \"value\": 3
      }
    },
    {
      \"type\": \"ir.IntImm\",
      \"data\": {
        \"span\": 1,
        \"ty\": 2,
        \"value\": 3
      }
    },
    {
      \"type\": \"ffi.Array\",
      \"data\": [
        4,
        5
      ]
    },
    {
      \"type\": \"relax.ShapeType\",
      \"data\": {
        \"span\": 1,
        \"values\": 6,
        \"ndim\": 2
      }
    },
    {
      \"type\": \"relax.expr.ShapeExpr\",
      \"data\": {
        \"span\": 1,
        \"ty\": 7,
        \"values\": 6
      }
    },
    {
      \"type\": \"relax.TensorType\",
      \"data\": {
        \"span\": 1,
        \"shape\": 8,
        \"dtype\": 2,
        \"vdevice\": 1,
        \"ndim\": 2
      }
    },
    {
      \"type\": \"ffi.Tensor\",
      \"data\": \"P6G0lvBAXt0AAAAAAAAAAAEAAAAAAAAAAgAAAABAAQABAAAAAAAAAAEAAAAAAAAACAAAAAAAAAAAAAAAAAAAAA==\"
    },
    {
      \"type\": \"ir.GenericConst\",
      \"data\": {
        \"span\": 1,
        \"ty\": 9,
        \"value\": 10
      }
    },
    {
      \"type\": \"ffi.Array\",
      \"data\": [
        11
      ]
    },
    {
      \"type\": \"ffi.Map\",
      \"data\": [
        0,
        12
      ]
    }
  ],
  \"metadata\": {
    \"tvm_version\": \"0.27.0.post1\"
  }
}""")
# from tvm.script import ir as I
# from tvm.script import relax as R

@I.ir_module
class Module:
    @R.function
    def main(x0: R.Tensor((4, 1), dtype="float16"), x1: R.Tensor((1, 1), dtype="float16")) -> R.Tensor((4, 1), dtype="float16"):
        with R.dataflow():
            lv: R.Tensor((4, 1), dtype="float16") = R.scatter_elements(x0, metadata["ir.GenericConst"][0], x1, axis=1, reduction="update")
            gv: R.Tensor((4, 1), dtype="float16") = lv
            R.output(gv)
        return gv'''

INPUTS = [([4, 1], 'float16', False), ([1, 1], 'float16', False)]  # (shape, dtype, with IEEE specials) of each input, drawn from default_rng(0)
DTYPES = ['float16']


def test_fuzz_f59eafc766() -> None:
    mod = tvm.script.from_source(SOURCE)
    rng = np.random.default_rng(0)
    inputs = [make_input(rng, shape, dtype, special) for shape, dtype, special in INPUTS]
    check_module(mod, inputs, set(DTYPES))
