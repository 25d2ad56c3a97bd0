"""Fuzz regression fuzz_2293021c57: Exception: process aborted in compute_inline: the Elementwise rule inlined a reduction whose reduce loops all have extent 1 (fixed in schedules/cpu/elementwise.py)

Found by ``tests/fuzz/test_differential.py`` (derandomized run); the shrunk program:

    inputs=[((1, 1, 1, 2), 'float32')], n=3
      v1 = conv2d(0,) {'strides': [1, 1], 'padding': [0, 0], 'groups': 1, 'const': {'shape': [1, 1, 1, 1], 'seed': 0}}
      v2 = sum(1,) {'axes': [0, 1, 2, 3], 'keepdims': True}
      v3 = written_softmax(2,) {'axis': 1}
      outputs=(3,)
"""

import numpy as np
import tvm

from tests.fuzz.check import check_module

SOURCE = r'''metadata = tvm.ir.load_json("""{
  \"root_index\": 16,
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
        5,
        6,
        7
      ]
    },
    {
      \"type\": \"relax.ShapeType\",
      \"data\": {
        \"span\": 1,
        \"values\": 8,
        \"ndim\": 4
      }
    },
    {
      \"type\": \"relax.expr.ShapeExpr\",
      \"data\": {
        \"span\": 1,
        \"ty\": 9,
        \"values\": 8
      }
    },
    {
      \"type\": \"ir.PrimType\",
      \"data\": {
        \"span\": 1,
        \"dtype\": \"float32\"
      }
    },
    {
      \"type\": \"relax.TensorType\",
      \"data\": {
        \"span\": 1,
        \"shape\": 10,
        \"dtype\": 11,
        \"vdevice\": 1,
        \"ndim\": 4
      }
    },
    {
      \"type\": \"ffi.Tensor\",
      \"data\": \"P6G0lvBAXt0AAAAAAAAAAAEAAAAAAAAABAAAAAIgAQABAAAAAAAAAAEAAAAAAAAAAQAAAAAAAAABAAAAAAAAAAQAAAAAAAAAbL8APg==\"
    },
    {
      \"type\": \"ir.GenericConst\",
      \"data\": {
        \"span\": 1,
        \"ty\": 12,
        \"value\": 13
      }
    },
    {
      \"type\": \"ffi.Array\",
      \"data\": [
        14
      ]
    },
    {
      \"type\": \"ffi.Map\",
      \"data\": [
        0,
        15
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
    def main(x0: R.Tensor((1, 1, 1, 2), dtype="float32")) -> R.Tensor((1, 1, 1, 1), dtype="float32"):
        with R.dataflow():
            lv: R.Tensor((1, 1, 1, 2), dtype="float32") = R.nn.conv2d(x0, metadata["ir.GenericConst"][0], strides=[1, 1], padding=[0, 0, 0, 0], dilation=[1, 1], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW", out_dtype=None)
            lv1: R.Tensor((1, 1, 1, 1), dtype="float32") = R.sum(lv, axis=[0, 1, 2, 3], keepdims=True)
            lv2: R.Tensor((1, 1, 1, 1), dtype="float32") = R.max(lv1, axis=[1], keepdims=True)
            lv3: R.Tensor((1, 1, 1, 1), dtype="float32") = R.subtract(lv1, lv2)
            lv4: R.Tensor((1, 1, 1, 1), dtype="float32") = R.exp(lv3)
            lv5: R.Tensor((1, 1, 1, 1), dtype="float32") = R.sum(lv4, axis=[1], keepdims=True)
            lv6: R.Tensor((1, 1, 1, 1), dtype="float32") = R.divide(lv4, lv5)
            gv: R.Tensor((1, 1, 1, 1), dtype="float32") = lv6
            R.output(gv)
        return gv'''

INPUTS = [([1, 1, 1, 2], 'float32')]  # (shape, dtype) of each input, filled from default_rng(0)
DTYPES = ['float32']


def test_fuzz_2293021c57() -> None:
    mod = tvm.script.from_source(SOURCE)
    rng = np.random.default_rng(0)
    inputs = [np.asarray(rng.standard_normal(shape)).astype(dtype) for shape, dtype in INPUTS]
    check_module(mod, inputs, set(DTYPES))
