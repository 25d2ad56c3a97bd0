"""``from_torch`` on modules whose branches and shapes read the values of their own tensors
(``aicf_tvm/driver/frontends/torch_export.py``): imported and equal to PyTorch eager; one that reads
an input's values is refused."""

from __future__ import annotations

import pytest

import aicf_tvm
from aicf_tvm import UnsupportedModelError

from ....helpers import Operands, assert_matches_reference, torch_function

torch = pytest.importorskip("torch")


class Logits(torch.nn.Module):
    """An image classifier called with ``pixel_values``, returning its logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


class TensorWindow(torch.nn.Module):
    """A size and a flag kept as a tensor attribute: ``int(self.window)`` and
    ``if self.window >= 4`` are guards on an unbacked symbol for torch.export."""

    def __init__(self) -> None:
        super().__init__()
        self.window = torch.tensor(4)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        if self.window >= 4:
            x = torch.tanh(x)
        return self.proj(x.view(-1, int(self.window), 8)).sum(1)


class BufferFlag(torch.nn.Module):
    """A flag in a buffer: read only, it is a constant of the module; counted up by the
    forward, its value differs from call to call."""

    def __init__(self, counts: bool) -> None:
        super().__init__()
        self.counts = counts
        self.register_buffer("calls", torch.tensor(2))

    def forward(self, x):
        if self.counts:
            self.calls.add_(1)
        if self.calls > 1:
            return torch.sin(x)
        return torch.cos(x)


class InputBranch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def _compiled_matches_eager(module: torch.nn.Module, shape: tuple[int, ...], seed: int) -> None:
    """Import ``module`` (state as it is now), then compare with eager on two inputs; eager
    runs last, since a call may change the module's state (Swin resets its window)."""
    rand = Operands(seed)
    inputs = [[rand(*shape)], [rand(*shape)]]
    compiled = aicf_tvm.compile(aicf_tvm.from_torch(module, (torch.from_numpy(inputs[0][0]),)))
    assert_matches_reference(compiled, torch_function(module), inputs, rtol=1e-4, atol=1e-5)


def test_tensor_attribute_in_a_branch_and_a_shape_matches_torch():
    torch.manual_seed(0)
    _compiled_matches_eager(TensorWindow().eval(), (1, 16, 8), seed=1)


def test_swin_after_a_jit_trace_matches_torch():
    """``torch.jit.trace`` (as ``torch.onnx.export(dynamo=False)`` runs it) leaves Swin's
    clamped ``window_size`` a tensor: the last stage's 4x4 map is no larger than the window."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.SwinConfig(image_size=32, embed_dim=32, depths=[1, 1], num_heads=[2, 2], window_size=4)
    module = Logits(transformers.SwinForImageClassification(cfg)).eval()
    with torch.no_grad():
        torch.jit.trace(module, (torch.zeros(1, 3, 32, 32),), check_trace=False)
    assert any(isinstance(getattr(m, "window_size", None), torch.Tensor) for m in module.modules())
    _compiled_matches_eager(module, (1, 3, 32, 32), seed=2)


def test_branch_on_an_unwritten_buffer_matches_torch():
    _compiled_matches_eager(BufferFlag(counts=False).eval(), (3, 5), seed=4)


def test_branch_on_a_buffer_the_forward_writes_is_refused():
    x = torch.from_numpy(Operands(5)(3, 5))
    with pytest.raises(UnsupportedModelError, match=r"state the model writes.*if self\.calls > 1"):
        aicf_tvm.from_torch(BufferFlag(counts=True), (x,))


def test_branch_on_an_input_value_is_refused_naming_the_line():
    x = torch.from_numpy(Operands(3)(4))
    with pytest.raises(UnsupportedModelError, match=r"InputBranch: a branch or shape depends on the values "
                                                     r"of an input.*if x\.sum\(\) > 0"):
        aicf_tvm.from_torch(InputBranch(), (x,))


class AddTwo(torch.nn.Module):
    def forward(self, x, y):
        return x + y


def test_a_refused_dim_keeps_torch_exports_whole_guard_message():
    """Two named dims the graph forces equal: torch.export's error puts the guard and its
    suggested fix on the lines after the first, and the user needs them."""
    x, y = (torch.from_numpy(Operands(7)(3, 4)) for _ in range(2))
    dims = ({0: torch.export.Dim("a")}, {0: torch.export.Dim("b")})
    with pytest.raises(UnsupportedModelError) as info:
        aicf_tvm.from_torch(AddTwo(), (x, y), dynamic_shapes=dims)
    message = str(info.value)
    assert message.startswith("torch.export could not capture AddTwo: ")
    assert "must always be equal" in message and "Suggested fixes" in message and "\n" in message
