"""CompiledModel: run a compiled module on numpy arrays; inspect its kernels and report.

``load`` makes one from a library written by ``CompiledModel.export`` (the format is
``aicf_tvm.runtime.deploy``'s). Only TVM's runtime is imported here (``tvm.runtime``, the VM, no
Relax): a model loaded by ``aicf_tvm.load`` runs where only ``libtvm_runtime`` exists.
A freshly compiled model gets its signature, bounds, requirements and kernels from
the driver (``aicf_tvm.driver.compiled``), which reads them off the Relax module.

Every call is checked before anything runs: the inputs' names, dtypes and static dims,
each symbolic dim equal across the inputs and within its bounds, and the relations of
the dims that the model's ops require (``aicf_tvm.runtime.call_checks``); all of it travels in an
exported library's metadata.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import tvm
import tvm_ffi
from tvm.runtime.vm import VirtualMachine

from aicf_tvm.core.emit import plain
from aicf_tvm.core.errors import DeployError, InputError, TargetError
from aicf_tvm.core.lattice.shape import row_major
from aicf_tvm.core.report import Decision, FusionReport
from aicf_tvm.runtime.call_checks import BoundDim, Requirement, check_requirements

from .cpu_features import unrunnable_here
from .cuda_binary import install_hook
from .deploy import (
    DeviceLike,
    check_target,
    copy_library,
    device_for,
    export,
    load_fresh,
    mapped_here,
    read_metadata,
    verify_digest,
)
from .mapped_weights import map_weights
from .targets import describe
from .threads import on_every_cpu, thread_count, use_threads

# Every kernel buffer assumes TVM's allocation alignment (LowerEmits records it per port
# as ``aicf.abi``); external inputs are proven only ``align1``.
BOUNDARY_ALIGN = 64

# what a model returns: an array per output, a (nested) list for a tuple of outputs
Outputs = np.ndarray | list["Outputs"]
# a Relax VM executable: as ``tvm.compile`` builds it, or loaded from a library
Executable = tvm.runtime.Executable | tvm.runtime.Module


def to_device(value: npt.ArrayLike, device: tvm.runtime.Device) -> tuple[tvm.runtime.Tensor, bool]:
    """The input as a TVM tensor: zero-copy when it already meets the kernels' ABI
    (row-major strides, 64-byte aligned, on the CPU), else an explicit copy. Returns
    (tensor, copied)."""
    arr = np.asarray(value)
    if (device.dlpack_device_type() == 1 and arr.size > 0 and _has_row_major_strides(arr)
            and arr.ctypes.data % BOUNDARY_ALIGN == 0):
        try:
            return tvm.runtime.from_dlpack(arr), False
        except (BufferError, TypeError, ValueError):  # e.g. a read-only array
            pass
    return tvm.runtime.tensor(_contiguous(arr), device), True  # rank 0 stays rank 0


def _has_row_major_strides(arr: np.ndarray) -> bool:
    """Whether ``arr``'s strides are exactly the row-major ones of its shape, as the
    kernels' buffers declare them. numpy's ``c_contiguous`` flag is weaker: it holds for
    every zero-size array (``np.zeros((0, 4))`` has strides ``(0, 0)``) and ignores the
    strides of size-1 dims, and DLPack passes the strides on as they are."""
    return arr.strides == tuple(s * arr.itemsize for s in row_major(arr.shape))


def _contiguous(value: npt.ArrayLike) -> np.ndarray:
    """A C-contiguous array; unlike ``np.ascontiguousarray`` a rank-0 input stays rank 0."""
    arr = np.asarray(value)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _to_numpy(value: tvm.runtime.Tensor | Sequence) -> Outputs:
    """A VM result as numpy: a tensor as an array, a tuple as a list (nested as returned)."""
    if hasattr(value, "numpy"):
        return value.numpy()
    return [_to_numpy(v) for v in value]


def flat_outputs(result: Outputs) -> list[np.ndarray]:
    """The arrays of a ``CompiledModel`` call's result in the order of its ``outputs``
    (whose names number the nesting: ``output.0.1``)."""
    if isinstance(result, (list, tuple)):
        return [a for r in result for a in flat_outputs(r)]
    return [result]


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (ints, or str for symbolic dims) and dtype of one input or output."""

    name: str
    shape: tuple
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> TensorSpec:
        return cls(str(data["name"]), tuple(data["shape"]), str(data["dtype"]))

    def check(self, value: np.ndarray) -> None:
        if str(value.dtype) != self.dtype:
            raise InputError(f"input {self.name}: dtype {value.dtype}, expected {self.dtype}")
        if len(value.shape) != len(self.shape) or any(
            isinstance(want, int) and want != got for want, got in zip(self.shape, value.shape)
        ):
            raise InputError(f"input {self.name}: shape {list(value.shape)}, expected {list(self.shape)}")


@dataclass(frozen=True)
class Kernel:
    """One PrimFunc called per inference: its name, Emit kind and schedule source."""

    name: str
    kind: str
    schedule: str
    plan: str = ""  # the rule's choices (tiles, layouts), where the rule notes them

    def __str__(self) -> str:
        return f"{self.name} ({self.kind}, {self.schedule}{': ' + self.plan if self.plan else ''})"


def _spec_of(target: tvm.target.Target | Mapping[str, Any]) -> dict:
    """A target as its exported, JSON-able dict."""
    if isinstance(target, Mapping):
        return dict(target)
    return plain(target.export())


def is_gpu(spec: Mapping[str, Any]) -> bool:
    return spec.get("kind") == "cuda" or "gpu" in (spec.get("keys") or ())


@dataclass
class Signature:
    """What one function of a module takes and returns: its inputs and outputs, the bounds
    of its symbolic dims and the relations its dims must meet (checked before a call)."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    dim_bounds: dict[str, list] = field(default_factory=dict)
    requirements: list[Requirement] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"inputs": [s.to_json() for s in self.inputs], "dim_bounds": self.dim_bounds,
                "requirements": [r.to_json() for r in self.requirements],
                "outputs": [s.to_json() for s in self.outputs]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Signature:
        return cls([TensorSpec.from_json(s) for s in data["inputs"]],
                   [TensorSpec.from_json(s) for s in data["outputs"]],
                   dict(data.get("dim_bounds", {})),
                   [Requirement.from_json(r) for r in data.get("requirements", [])])

    def arrange(self, args: Sequence[npt.ArrayLike], named: Mapping[str, npt.ArrayLike]) -> list[np.ndarray]:
        """Positional then named inputs, in the order of ``inputs``; names are checked."""
        names = [s.name for s in self.inputs]
        expected = ", ".join(names) or "none"
        if len(args) > len(names):
            raise InputError(f"expected {len(names)} inputs ({expected}), got {len(args)}")
        values: dict[str, npt.ArrayLike] = dict(zip(names, args))
        for key, value in named.items():
            if key not in names:
                raise InputError(f"no input named {key!r}; the inputs are: {expected}")
            if key in values:
                raise InputError(f"input {key!r} given twice")
            values[key] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise InputError(f"missing input {', '.join(missing)} (the inputs are: {expected})")
        return [np.asarray(values[n]) for n in names]

    def check(self, args: Sequence[np.ndarray]) -> None:
        """``InputError`` unless ``args`` match the inputs: count, dtype, shape, each
        symbolic dim one value within its bounds, the requirements met."""
        if len(args) != len(self.inputs):
            names = ", ".join(s.name for s in self.inputs)
            raise InputError(f"expected {len(self.inputs)} inputs ({names}), got {len(args)}")
        bound: dict[str, BoundDim] = {}  # symbolic dim -> (value, the input, its axis)
        for spec, value in zip(self.inputs, args):
            value = np.asarray(value)
            spec.check(value)
            for axis, (want, got) in enumerate(zip(spec.shape, value.shape)):
                if not (isinstance(want, str) and want.isidentifier()):
                    continue
                first = bound.setdefault(want, (got, spec.name, axis))
                if first[0] != got:
                    raise InputError(f"input {spec.name}: dim {want} = {got}, but input {first[1]} "
                                     f"has {want} = {first[0]}")
                low, high = self.dim_bounds.get(want, (None, None))
                if (low is not None and got < low) or (high is not None and got > high):
                    raise InputError(f"input {spec.name}: dim {want} = {got} is outside its bounds "
                                     f"[{'' if low is None else low}, {'' if high is None else high}]")
        check_requirements(self.requirements, bound)


class CompiledModel:
    """A compiled module: call it with numpy arrays, get numpy arrays back.

    Inputs go in order, or by name (``model(x=a)``); one output returns one array,
    a tuple returns a list (a nested tuple, nested lists; ``flat_outputs`` lines them up
    with ``outputs``). A model returned by ``aicf_tvm.load`` has no Relax modules
    (``optimized``/``lowered`` are None) but keeps the metadata it was exported with.
    ``target`` is a ``tvm.target.Target`` or its exported dict (``target_spec``, what a
    runtime-only process has). It runs with ``threads`` CPU threads (see
    ``aicf_tvm.runtime.threads.thread_count`` for the default). A module of several entry
    functions (a causal LM's prompt and decode steps) runs each with ``call(name, ...)``,
    checked against its own ``signature(name)``; ``model(...)`` runs ``main``.
    """

    def __init__(self, executable: Executable, target: tvm.target.Target | Mapping[str, Any],
                 *, threads: int | None = None,
                 report: FusionReport | None = None, lowered: tvm.IRModule | None = None,
                 optimized: tvm.IRModule | None = None, inputs: Sequence[TensorSpec] | None = None,
                 outputs: Sequence[TensorSpec] | None = None, kernels: Sequence[Kernel] | None = None,
                 device: tvm.runtime.Device | None = None, metadata: Mapping[str, Any] | None = None,
                 path: str | None = None, dim_bounds: Mapping[str, Sequence] | None = None,
                 requirements: Sequence[Requirement] | None = None,
                 emit_listing: Callable[[], tuple[list, str]] | None = None,
                 functions: Mapping[str, Signature] | None = None, weights: Any = None) -> None:
        self.executable = executable
        # what every function of ``executable`` takes last: a library's mapped weights (None: inside it)
        self.weights = weights
        self._target = None if isinstance(target, Mapping) else target
        self.target_spec = _spec_of(target)
        self.report = report if report is not None else FusionReport()
        self.optimized = optimized
        self.lowered = lowered
        self.dim_bounds = {str(k): list(v) for k, v in (dim_bounds or {}).items()}
        self.requirements = list(requirements or [])
        self.inputs = list(inputs or [])
        self.outputs = list(outputs or [])
        self.kernels = list(kernels or [])
        self._functions = dict(functions or {})  # the entry functions besides main: their signatures
        # () -> (the Emit calls as JSON, the Emit table): what an export records (deploy)
        self.emit_listing = emit_listing
        self.timings: dict[str, float] = {}  # seconds per compile phase (the driver's compile)
        self.extra_metadata: dict[str, Any] = {}  # more JSON an export records (a CausalLM's config)
        self.device = device if device is not None else (tvm.cuda() if is_gpu(self.target_spec) else tvm.cpu())
        self.metadata = dict(metadata) if metadata is not None else None
        self.path = path  # the library it was loaded from, if any
        self.exported: str | os.PathLike | None = None  # a library export wrote of it (the compile cache's)
        self.threads = thread_count(threads, self.target_spec)
        self._vms = threading.local()  # one VM per calling thread (``vm``)
        # instructions of the target this CPU lacks (a library that needs one is refused at load)
        self.lacking_features = unrunnable_here(self.target_spec) if metadata is None else []

    @property
    def target(self) -> tvm.target.Target:
        """The ``tvm.target.Target`` (built from ``target_spec`` on first use: that needs
        TVM's compiler library, which a runtime-only process lacks)."""
        if self._target is None:
            if getattr(tvm.base, "_RUNTIME_ONLY", False):
                raise DeployError(f"{self.path or 'model'}: a tvm.target.Target needs TVM's compiler "
                                  f"library; use target_spec in a runtime-only process")
            spec = dict(self.target_spec)
            host = spec.pop("host", None)
            self._target = tvm.target.Target(spec, host=tvm.target.Target(host) if host else None)
        return self._target

    def __repr__(self) -> str:
        sig = ", ".join(f"{s.name}: {s.dtype}{list(s.shape)}" for s in self.inputs)
        where = f" from {self.path}" if self.path else ""
        return f"<CompiledModel ({sig}) on {describe(self.target_spec)}, {len(self.kernels)} kernels{where}>"

    def export(self, path: str | Path) -> Path:
        """Write a shared library that carries this model's metadata (see ``aicf_tvm.load``).

        A model loaded from a library, or exported before (the compile cache), is written
        as a copy of that library while it is whole (its digest checked): the same bytes,
        without generating the code again."""
        for source in (self.exported, self.path):
            if source is not None and (copied := copy_library(source, path)) is not None:
                return copied
        if isinstance(self.executable, tvm.runtime.Module):  # runs from a library's machine code
            raise DeployError(f"{self.exported or self.path}: the library this model runs from is gone or was "
                              f"changed, and its code cannot be written again from memory; compile the model "
                              f"again to export it")
        return export(self, path)

    @property
    def vm(self) -> VirtualMachine:
        """The calling thread's VM, with its TVM pool sized to ``threads`` (the pool is per
        thread: every thread that runs the model goes through here).

        One VM per thread: a VM keeps the frames and registers of the call it runs, so two
        threads calling one VM overwrite each other's (TVM's ``reg <
        frame->register_file.size()`` check, or a crash).  The VMs share the executable
        and its constants, which no call writes.  A target whose instructions this CPU
        lacks is refused here, before any kernel runs."""
        if self.lacking_features:
            raise TargetError(
                f"{self.path or 'this model'} was compiled for {describe(self.target_spec)}, "
                f"whose instructions {', '.join(self.lacking_features)} this CPU lacks; export it "
                f"for a machine that has them, or compile it here with target='llvm'")
        use_threads(self.threads)
        vm = getattr(self._vms, "vm", None)
        if vm is None:
            vm = self._vms.vm = VirtualMachine(self.executable, self.device)
        return vm

    @property
    def weights_args(self) -> list[Any]:
        """What a VM function of this model takes after its inputs: a library's mapped
        weights, or nothing (the executable holds them)."""
        return [] if self.weights is None else [self.weights]

    def function(self, name: str = "main") -> Callable[..., Any]:
        """The calling thread's VM function ``name``, taking the model's inputs (the weights
        of a library that keeps them apart passed on by it): unchecked, on TVM tensors."""
        vm_function = self.vm[name]
        if self.weights is None:
            return vm_function
        weights = self.weights
        return lambda *args: vm_function(*args, weights)

    def warm_up(self) -> None:
        """Make the kernels' machine code and the calling thread's VM now, not at the first
        call: an executable fresh from ``compile`` holds its kernels as LLVM IR, which TVM
        turns into machine code when the first VM looks them up (a BERT's first call took
        ten steady calls' time); a loaded library has it already. Does nothing where the
        model cannot run here (a CPU without the target's instructions, an absent GPU)."""
        if not self.lacking_features and self.device.exist:
            jit_in_parallel(self.executable)
            _ = self.vm

    def run_from_library(self) -> None:
        """``warm_up`` from the library ``exported`` names (just written by the compile
        cache): its kernels' machine code is loaded instead of generated again by the JIT,
        and the executable built in this process is let go. Its weights, where the library
        keeps them apart, are the tensors this process holds already (not mapped again).
        Only a CPU target that runs here; elsewhere, or when the library cannot be loaded,
        ``warm_up`` as before."""
        lib = None
        if (self.exported is not None and not self.lacking_features and self.device.exist
                and self.target_spec.get("kind") == "llvm"):
            try:
                lib = load_fresh(self.exported)
                apart = getattr(self.executable, "weights_apart", None)
                weights = (map_weights(os.fspath(self.exported), read_metadata(self.exported, verify=False))
                           if apart is None else tvm_ffi.convert(apart.weights))  # the very tensors it wrote
            except Exception:  # noqa: BLE001 - the built executable still runs
                lib = None
        if lib is not None and lib.kind == "relax.VMExecutable":
            self.executable, self.weights, self._vms = lib, weights, threading.local()
        self.warm_up()

    def signature(self, function: str = "main") -> Signature:
        """The inputs, outputs, dim bounds and requirements of ``function``."""
        if function == "main":
            return Signature(self.inputs, self.outputs, self.dim_bounds, self.requirements)
        if function not in self._functions:
            raise InputError(f"no function {function!r} in {self.path or 'this model'}; "
                             f"it has: {', '.join(self.function_names)}")
        return self._functions[function]

    @property
    def function_names(self) -> list[str]:
        """The functions a caller may run (``call``): ``main`` first."""
        return ["main", *self._functions]

    def check_inputs(self, args: Sequence[np.ndarray], function: str = "main") -> None:
        self.signature(function).check(args)

    def arrange(self, args: Sequence[npt.ArrayLike], named: Mapping[str, npt.ArrayLike],
                function: str = "main") -> list[np.ndarray]:
        """Positional then named inputs, in the order of ``inputs``; names are checked."""
        return self.signature(function).arrange(args, named)

    def call(self, function: str, *args: np.ndarray, **named: np.ndarray) -> Outputs:
        """Run ``function`` (one of ``function_names``) on numpy arrays, its inputs checked
        against its own signature, as ``model(...)`` runs ``main``."""
        signature = self.signature(function)
        arrays = signature.arrange(args, named)
        signature.check(arrays)
        moved = [to_device(a, self.device) for a in arrays]
        self.boundary_copies = [spec.name for spec, (_, copied) in zip(signature.inputs, moved) if copied]
        return _to_numpy(self.function(function)(*[t for t, _ in moved]))

    def __call__(self, *args: np.ndarray, **named: np.ndarray) -> Outputs:
        return self.call("main", *args, **named)

    def benchmark(self, *args: np.ndarray, number: int = 10, repeat: int = 3, function: str = "main") -> float:
        """Median seconds per call of ``function`` (TVM's time evaluator)."""
        self.signature(function)  # an unknown name is refused by name
        arrays = [tvm.runtime.tensor(_contiguous(a), self.device) for a in args]
        timer = self.vm.time_evaluator(function, self.device, number=number, repeat=repeat)
        return float(timer(*arrays, *self.weights_args).median)


def jit_in_parallel(executable: Any) -> None:
    """Have TVM's JIT make the machine code of the LLVM modules ``executable`` imports (the
    kernels ``pipeline.build_in_parts`` built apart) on every core, where the first VM
    would make them one after the other. Any lookup starts a module's JIT; a missing name is
    looked up so that nothing else runs. Nothing to do for a loaded library."""
    modules = [m for m in getattr(executable, "mod", executable).imports if m.kind == "llvm"]

    def jit(module: tvm.runtime.Module) -> None:
        try:
            module.get_function("__aicf_jit__", query_imports=False)
        except AttributeError:  # the name is not there: the module's code is made all the same
            pass

    on_every_cpu(jit, modules)


def load(path: str | os.PathLike, device: DeviceLike | None = None, threads: int | None = None) -> CompiledModel:
    """A callable ``CompiledModel`` from a library written by ``export``, run with
    ``threads`` CPU threads (default: see ``aicf_tvm.runtime.threads.thread_count``)."""
    name = os.fspath(path)
    meta = read_metadata(name, verify=False)
    target = check_target(meta, name)
    dev = device_for(target, device, name)
    if target.get("kind") == "cuda":
        install_hook()  # the kernels' fatbin travels in the library: no CUDA compiler needed here
    # the file's digest is checked while TVM loads it (hashing releases the GIL): a library
    # of hundreds of MB loads in about the time TVM alone takes
    # (before it where this process has the file mapped: dlopen would hand back that mapping,
    # which a rewrite in place changed); TVM loads it under a name of its own (``load_fresh``)
    # A library's weights apart from its code are mapped meanwhile (``mapped_weights``).
    with ThreadPoolExecutor(1) as pool:
        if mapped_here(name):
            verify_digest(name)
            digest = None
        else:
            digest = pool.submit(verify_digest, name)
        try:
            lib = load_fresh(name)
            weights = map_weights(name, meta)
        except Exception as err:
            if digest is not None:
                digest.result()  # a corrupt file is named as such
            if isinstance(err, DeployError):
                raise
            raise DeployError(f"{name}: cannot be loaded: {str(err).strip().splitlines()[0]}") from err
        if digest is not None:
            digest.result()
    if lib.kind != "relax.VMExecutable":
        raise DeployError(f"{name}: holds a {lib.kind} module, not a Relax VM executable")
    try:
        report = FusionReport([Decision(d["candidate"], tuple(d["members"]), bool(d["accepted"]),
                                        tuple(d["failures"]), d["note"], int(d["benefit"]))
                               for d in meta["fusion"]["decisions"]])
        main = Signature.from_json(meta)  # main's signature: the metadata's top-level keys
        model = CompiledModel(
            lib, target, report=report, device=dev, metadata=meta, path=name, threads=threads,
            inputs=main.inputs, dim_bounds=main.dim_bounds, requirements=main.requirements,
            outputs=main.outputs,
            kernels=[Kernel(k["name"], k["kind"], k["schedule"], k.get("plan", "")) for k in meta["kernels"]],
            functions={f: Signature.from_json(sig) for f, sig in meta.get("functions", {}).items()},
            weights=weights,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise DeployError(f"{name}: incomplete AICF metadata ({type(err).__name__}: {err})") from err
    model.vm  # noqa: B018 - the loading thread's VM and thread pool, made now: the first call runs as the next
    return model
