"""``to_python``: the one conversion of TVM attr values to plain Python."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax, tirx

from aicf_tvm import EncodingError
from aicf_tvm.core.emit import plain
from aicf_tvm.core.tvm_values import to_python


def test_containers_and_immediates_become_python_values():
    value = tvm.runtime.convert({
        "shape": [tirx.IntImm("int64", 3), 4],
        "flag": tirx.IntImm("bool", 1),
        "scale": tirx.FloatImm("float32", 0.5),
        "name": tvm.ir.StringImm("gelu"),
        "nested": {"axes": (0, -1)},
    })
    converted = to_python(value)
    assert converted == {"shape": [3, 4], "flag": True, "scale": 0.5, "name": "gelu",
                         "nested": {"axes": [0, -1]}}
    assert type(converted["flag"]) is bool and type(converted["name"]) is str


def test_relax_shape_and_tuple_become_lists_and_the_rest_goes_to_other():
    n = tirx.Var("n", "int64")
    shape = relax.ShapeExpr([n * 2, 8])
    assert to_python(shape) == [str(n * 2), 8]
    assert to_python(shape, other=lambda v: "?") == ["?", 8]
    assert to_python(relax.Tuple([tirx.IntImm("int64", 1), shape])) == [1, [str(n * 2), 8]]
    assert to_python(None) == "None" and to_python(None, other=lambda v: v) is None


@pytest.mark.parametrize("value", [None, tirx.Var("n", "int64"), [1, None]])
def test_annotation_decoder_refuses_a_value_with_no_plain_form(value):
    with pytest.raises(EncodingError, match="unexpected value .* in an aicf.emit annotation"):
        plain(value)
