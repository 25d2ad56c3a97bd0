"""compile_optimizer_step: an optimizer step that updates P, M and V in their own buffers.

The caller-facing contract of an in-place step (docs/design.md §3 effects): the compiled
function **takes ownership of** (is donated) every tensor it is passed: P, M and V are
overwritten with their new values, and the returned tuples hold those same buffers.
So the caller must pass each input as its own buffer. The step asserts it to the
compiler (``aicf.distinct_inputs``: distinct caller inputs are NoAlias, which lets
``FuseAdamSteps`` update in place) and checks it at every call: two inputs whose
bytes overlap raise ``InputError`` naming both, before anything runs.

``adam_function`` builds TVM's own Adam step (``relax.training.optimizer.Adam``) for a
list of parameter shapes; ``adam_state`` its initial state.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import tvm
from tvm import relax

from aicf_tvm.core.errors import InputError, UnsupportedModelError
from aicf_tvm.core.kinds.adam import DISTINCT_INPUTS_ATTR
from aicf_tvm.core.report import FusionReport
from aicf_tvm.runtime.compiled import Executable
from aicf_tvm.runtime.targets import TargetLike, resolve_target
from aicf_tvm.runtime.threads import thread_count, use_threads
from relax_passes.fuse_adam_steps import FuseAdamSteps
from relax_passes.lift_adam_steps import LiftAdamSteps
from relax_passes.lower_emits import kernel_calls

from .pipeline import run_pipeline

# the step's arguments and results on the device: tensors, in (nested) tuples as the
# function's parameters group them
Tensors = tvm.runtime.Tensor | Sequence["Tensors"]


def adam_function(shapes: Sequence[Sequence[int]], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                  eps: float = 1e-8, weight_decay: float = 0.0, dtype: str = "float32") -> relax.Function:
    """``relax.training.optimizer.Adam(...).get_function()`` for parameters of ``shapes``.

    In TVM 0.27 ``Adam.init`` fails (its dtype is a ``PrimType`` numpy cannot read), so
    the parameters and dtype are set the way ``init`` would, without the runtime state.
    """
    from tvm.relax.training.optimizer import Adam

    params = [relax.Var(f"w{i}", relax.TensorType(tuple(s), dtype)) for i, s in enumerate(shapes)]
    opt = Adam(lr, betas, eps, weight_decay)
    opt._set_params_and_dtype(params)
    opt.dtype, opt.state = dtype, ()
    return opt.get_function()


def adam_state(shapes: Sequence[Sequence[int]], dtype: str = "float32") -> list[np.ndarray]:
    """Adam's initial state: step 0, β1^0, β2^0, then every M, then every V (zeros)."""
    zeros = [np.zeros(tuple(s), dtype) for s in shapes]
    return [np.zeros((), "int64"), np.ones((), dtype), np.ones((), dtype), *zeros, *[z.copy() for z in zeros]]


def _flatten(value: Tensors, name: str, out: list[tuple[str, tvm.runtime.Tensor]]) -> None:
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        for i, v in enumerate(value):
            _flatten(v, f"{name}.{i}", out)
    else:
        out.append((name, value))


def _span(t: tvm.runtime.Tensor) -> tuple[int, int]:
    start = int(t.data_ptr())
    nbytes = int(np.prod(t.shape, dtype=np.int64)) * np.dtype(str(t.dtype)).itemsize
    return start, start + nbytes


def check_distinct(named: Sequence[tuple[str, tvm.runtime.Tensor]]) -> None:
    """Raise ``InputError`` when two tensors' bytes overlap (donated buffers must be distinct)."""
    spans = sorted((_span(t), name) for name, t in named if int(np.prod(t.shape, dtype=np.int64)) > 0)
    for ((_, a1), na), ((b0, _), nb) in itertools.pairwise(spans):
        if b0 < a1:
            raise InputError(
                f"inputs {na} and {nb} share memory, but the optimizer step updates its inputs in "
                f"place (donated buffers): pass each tensor as its own buffer, e.g. a copy of {nb}")


class OptimizerStep:
    """A compiled step ``(params, grads, state) -> (new params, new state)`` that updates in place.

    Every tensor passed is donated: when ``in_place`` is true, P, M and V are overwritten
    and the results are the same buffers. Pass ``tvm.runtime.Tensor`` values to keep
    them (numpy arrays are copied in, so their updates are only in the results).
    """

    def __init__(self, executable: Executable, target: tvm.target.Target, report: FusionReport, lowered: tvm.IRModule,
                 donate: bool, threads: int | None = None) -> None:
        self.executable, self.target, self.report, self.lowered = executable, target, report, lowered
        self.donate = donate
        self.threads = thread_count(threads, {"num-cores": target.attrs.get("num-cores")})
        self.device = tvm.cpu() if target.kind.name == "llvm" else tvm.device(target.kind.name)
        self._vm = None

    @property
    def vm(self) -> relax.VirtualMachine:
        """The VM (made on first use: a CUDA step compiles on a host without a GPU), with the
        calling thread's TVM pool sized to ``threads``."""
        use_threads(self.threads)
        if self._vm is None:
            self._vm = relax.VirtualMachine(self.executable, self.device)
        return self._vm

    @property
    def kernels(self) -> list[str]:
        """The PrimFuncs ``main`` launches, in program order."""
        return kernel_calls(self.lowered["main"])

    @property
    def in_place(self) -> bool:
        return any(d.accepted and d.candidate == "fused_adam_step" for d in self.report.decisions)

    def to_device(self, value: npt.ArrayLike | Tensors) -> Tensors:
        if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":  # results come back as Arrays
            return tuple(self.to_device(v) for v in value)
        return value if isinstance(value, tvm.runtime.Tensor) else tvm.runtime.tensor(np.asarray(value), self.device)

    def __call__(self, *args: npt.ArrayLike | Tensors) -> Tensors:
        args = tuple(self.to_device(a) for a in args)
        if self.donate:
            named: list[tuple[str, tvm.runtime.Tensor]] = []
            for i, a in enumerate(args):
                _flatten(a, f"arg{i}", named)
            check_distinct(named)
        return self.vm["main"](*args)


@dataclass(frozen=True)
class CallProfile:
    """What one VM call did: kernels launched (in order) and bytes of storage allocated.

    Storage is counted at the VM's ``vm.builtin.alloc_storage`` calls (after static memory
    planning every intermediate and every new output lives in one of them), so inputs
    plus ``storage_bytes`` bound the call's peak memory from above.
    """

    kernels: tuple[str, ...]
    storage_bytes: int


def profile_call(vm: relax.VirtualMachine, func_name: str, *args: Tensors) -> CallProfile:
    """Run ``vm[func_name](*args)`` once with an instrument counting launches and allocations."""
    kernels: list[str] = []
    storage = [0]

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *call_args: Any) -> int:
        if before and symbol == "vm.builtin.alloc_storage":
            storage[0] += int(np.prod([int(d) for d in call_args[1]], dtype=np.int64))
        elif before and not symbol.startswith("vm."):
            kernels.append(symbol)
        return 0

    vm.set_instrument(instrument)
    try:
        vm[func_name](*args)
    finally:
        vm.set_instrument(None)
    return CallProfile(tuple(kernels), storage[0])


def compile_optimizer_step(func: relax.Function | tvm.IRModule, target: TargetLike = "llvm", *, donate: bool = True,
                           threads: int | None = None) -> OptimizerStep:
    """Compile an optimizer step (a Relax function or a module with ``main``) to run in place.

    ``donate=False`` makes no assertion: caller inputs are then Unknown alias, the fusion
    is refused (see ``step.report``) and P, M, V are written to new buffers.
    """
    tgt = resolve_target(target)
    if isinstance(func, tvm.IRModule):
        if "main" not in [gv.name_hint for gv in func.get_global_vars()]:
            raise UnsupportedModelError("the module has no 'main' function")
        mod = func
    else:
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    if donate:
        mod["main"] = mod["main"].with_attr(DISTINCT_INPUTS_ATTR, True)
    report = FusionReport()
    stages = run_pipeline(mod, tgt, report=report,
                          # one bias term for all steps, then the steps lifted as Emits
                          before_optimize=[relax.transform.EliminateCommonSubexpr(), LiftAdamSteps()],
                          after_optimize=[FuseAdamSteps(report=report, gpu="gpu" in tgt.keys)])
    return OptimizerStep(stages.executable, tgt, report, stages.lowered, donate, threads)


__all__ = ["CallProfile", "OptimizerStep", "adam_function", "adam_state", "check_distinct", "compile_optimizer_step",
           "profile_call"]
