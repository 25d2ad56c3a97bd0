"""Capturing a ``torch.nn.Module`` as a core-ATen ``ExportedProgram``, also when a branch or
a shape reads the value of one of the module's own tensors.

``torch.export`` traces with fake tensors: a parameter, buffer or plain tensor attribute has
a shape but no value there, so ``if self.size_tensor >= 4:`` or ``x.view(-1, int(t))`` on
such a tensor is a guard on an unbacked symbol (``GuardOnDataDependentSymNode: Could not
guard on data-dependent expression Eq(u0, 1)``). Modules end up holding such tensors: a
``torch.jit.trace`` (``torch.onnx.export(dynamo=False)``) runs ``torch.jit.is_tracing()``
branches that store shapes as tensors (transformers' Swin keeps ``window_size`` as one
until the next eager call), and models that keep a size or a flag as a tensor.

On that error ``capture`` retries with ``torch.export.draft_export``, which evaluates each
such guard on the real values, specializes the branch to the outcome, records the
expression in its report and asserts it in the graph. The outcome holds for every call when
the value is computed from the module's constants alone (parameters, buffers it does not
write, tensor attributes), which are bound into the imported module as they are now: those
asserts are then truths about constants and are dropped (TVM translates neither them nor
the symbolic ``sym_ite`` they test). When an expression depends on an input
(``if x.sum() > 0``) or on state the forward writes, the specialization would hold for the
example only: ``capture`` refuses, naming the expression and the source line. (A fallback
through ``torch.onnx.export(dynamo=False)`` would not be sound: its trace specializes such
branches silently.)
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from aicf_tvm.core.errors import UnsupportedModelError

from .common import whole_message

if TYPE_CHECKING:
    import torch
    from torch.export._draft_export import FailureReport

# Loggers draft_export writes its report and each real-value evaluation to: an accepted
# specialization is sound (module docstring), its "could not soundly produce a graph"
# warning would mislead; a refused one becomes our error.
_DRAFT_LOGGERS = ("torch.export._draft_export", "torch.fx.experimental.symbolic_shapes")

# Names sympy prints for torch's size symbols: s0 (input dims), u0 (unbacked), zuf0 ...
_SYMBOL = re.compile(r"\b[a-z]+\d+\b")

# Tags of the ATen ops that read tensor values into a scalar or an output size.
_DATA_TAGS = {"data_dependent_output", "dynamic_output_shape"}


def trace(module: torch.nn.Module, args: Sequence[Any],
          dynamic_shapes: Any = None) -> torch.export.ExportedProgram | Exception:
    """``torch.export.export(module, args)``'s program as traced (not decomposed), or the
    data-dependent guard error that stopped it, for ``capture`` to draft past; any other
    failure is an ``UnsupportedModelError``."""
    import torch
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        return torch.export.export(module, tuple(args), dynamic_shapes=dynamic_shapes)
    except Exception as err:
        if not _caused_by(err, GuardOnDataDependentSymNode):
            raise UnsupportedModelError(
                f"torch.export could not capture {type(module).__name__}: {whole_message(err)}") from err
        return err


def capture(module: torch.nn.Module, args: Sequence[Any], dynamic_shapes: Any = None,
            traced: torch.export.ExportedProgram | Exception | None = None) -> torch.export.ExportedProgram:
    """``torch.export.export(module, args)`` decomposed to core ATen, or its
    ``draft_export`` when the only obstacle is a data-dependent guard on the module's
    constants (module docstring); ``traced`` is ``trace``'s result where the caller has it."""
    import torch

    name = type(module).__name__
    traced = trace(module, args, dynamic_shapes) if traced is None else traced
    if not isinstance(traced, Exception):
        return _decomposed(traced, name)
    guard_error = traced
    try:
        with _quiet(_DRAFT_LOGGERS):
            draft = torch.export.draft_export(module, tuple(args), dynamic_shapes=dynamic_shapes)
    except Exception as err:
        raise UnsupportedModelError(
            f"torch.export could not capture {name}: {whole_message(guard_error)}") from err
    ep = _decomposed(draft, name)  # functional: the buffers the forward writes are listed
    varying = varying_nodes(ep)
    reads = [node for node in varying if _reads_data(node)]
    for failure in draft._report.failures:
        refusal = _refusal(failure, reads)
        if refusal:
            raise UnsupportedModelError(f"torch.export could not capture {name}: {refusal}") from guard_error
    _drop_constant_asserts(ep, varying)
    return ep


def varying_nodes(ep: torch.export.ExportedProgram) -> set[torch.fx.Node]:
    """The nodes of ``ep``'s (functional) graph whose values depend on a user input or on
    a buffer the program writes; every other node is computed from parameters, unwritten
    buffers and constant tensors only, the same on every call."""
    from torch.export.graph_signature import InputKind

    signature = ep.graph_signature
    written = set(signature.buffers_to_mutate.values())
    constant = {spec.arg.name for spec in signature.input_specs
                if spec.kind in (InputKind.PARAMETER, InputKind.CONSTANT_TENSOR)
                or (spec.kind == InputKind.BUFFER and spec.target not in written)}
    varying: set[torch.fx.Node] = set()
    for node in ep.graph.nodes:
        if (node.op == "placeholder" and node.name not in constant) or any(
                arg in varying for arg in node.all_input_nodes):
            varying.add(node)
    return varying


def _reads_data(node: torch.fx.Node) -> bool:
    """Whether ``node`` turns tensor values into a scalar or a size (``item``, ``nonzero``:
    the ops that create unbacked symbols), or is a higher-order op whose body may."""
    import torch

    target = node.target
    return isinstance(target, torch._ops.HigherOrderOperator) or (
        isinstance(target, torch._ops.OpOverload) and bool(_DATA_TAGS & {tag.name for tag in target.tags}))


def _refusal(failure: FailureReport, reads: list[torch.fx.Node]) -> str | None:
    """Why ``failure`` of a draft export makes its program unsound, or None when the
    expression it specialized is a constant: all its symbols unbacked (no input dim), and
    no unbacked symbol computed from a varying value (``reads`` empty)."""
    import sympy
    from torch.export._draft_export import FailureType
    from torch.utils._sympy.symbol import SymT, symbol_is_type

    if failure.failure_type != FailureType.DATA_DEPENDENT_ERROR:
        return f"{failure.failure_type.name} in torch.export.draft_export"
    expr = failure.data.get("expr", "")
    symbols = [sympy.Symbol(s) for s in _SYMBOL.findall(expr)]
    unbacked = (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT)
    if symbols and not reads and all(symbol_is_type(s, unbacked) for s in symbols):
        return None
    stack = failure.data.get("user_stack") or [{}]
    return (f"a branch or shape depends on the values of an input or of state the model writes "
            f"({expr}, at `{stack[-1].get('loc', '?')}`)")


def _drop_constant_asserts(ep: torch.export.ExportedProgram, varying: set[torch.fx.Node]) -> None:
    """Remove the runtime asserts on constant values, then what only they used."""
    import torch

    for node in list(ep.graph.nodes):
        if node.target is torch.ops.aten._assert_scalar.default and node not in varying:
            ep.graph.erase_node(node)
    ep.graph.eliminate_dead_code()
    ep.graph_module.recompile()


def _decomposed(ep: torch.export.ExportedProgram, name: str) -> torch.export.ExportedProgram:
    if views_as_reshapes(ep.graph):
        ep.graph_module.recompile()
    try:
        return ep.run_decompositions()
    except Exception as err:
        raise UnsupportedModelError(f"torch.export could not capture {name}: {whole_message(err)}") from err


def _caused_by(err: BaseException, kind: type) -> bool:
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextlib.contextmanager
def _quiet(names: Sequence[str]) -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in names]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def _metadata_only() -> frozenset:
    """In-place ops that write no tensor data (``detach_``: autograd metadata, which
    ``torch.export`` leaves on lifted constants)."""
    import torch

    return frozenset({torch.ops.aten.detach_.default})


def views_as_reshapes(graph: torch.fx.Graph) -> int:
    """Retarget every ``aten.view`` of a graph without mutation to ``aten.reshape``; returns
    how many were retargeted.

    With a dynamic batch, ``run_decompositions`` re-traces ``scaled_dot_product_attention``
    through its math decomposition, whose output strides differ from the fused kernel's
    that ``torch.export`` saw: ``o.transpose(1, 2).contiguous().view(-1, d)`` (GPT-2's
    merged heads) then fails as a view of a non-viewable tensor. Without mutation a view
    and a reshape give the same values (aliasing is unobservable), and a reshape is a view
    wherever one is possible, so the decomposed graph is unchanged where it traced before.
    In-place ops that write no data (``detach_``) do not count as mutation.
    """
    import torch

    calls = [n for n in graph.nodes if n.op == "call_function"]
    metadata_only = _metadata_only()
    if any(getattr(getattr(n.target, "_schema", None), "is_mutable", False) and n.target not in metadata_only
           for n in calls):
        return 0
    views = [n for n in calls if n.target is torch.ops.aten.view.default]
    for node in views:
        node.target = torch.ops.aten.reshape.default
    return len(views)
