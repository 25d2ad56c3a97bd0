"""Inventory of the Relax ops our models use, with the attribute values each op is called with.

Models: every ``onnx/backend/test/data/light/*.onnx`` in the installed onnx wheel
(imported with ``relax.frontend.onnx.from_onnx``) and the built-in ``aicf_tvm.driver.models``.
For each model it prints the callee names with call counts (``relax.*`` ops;
``relax.call_tir`` and friends with their callee; ``call:<name>`` for calls of functions;
``<TupleGetItem>`` for tuple projections), then the union: which
models use each op and every distinct attribute signature. A signature lists the op's
attrs plus its non-tensor arguments (reshape target shapes, strided_slice axes/begin/end);
tensor arguments appear only when they are bound constants, as ``const(<rank>d)`` or
``const(scalar)``, because a constant operand is lowered differently from a computed one.

Usage: ``python -m scripts.list_ops [--json out.json] [--max-variants N]``
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from aicf_tvm.core.tvm_values import to_python
from aicf_tvm.driver.models import BUILTIN_MODELS

# Calls whose first argument names the real callee.
CALLEE_FIRST = {"relax.call_tir", "relax.call_dps_packed", "relax.call_pure_packed"}


def light_models() -> dict[str, Callable[[], tvm.IRModule]]:
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return {
        Path(path).stem: (lambda path=path: import_onnx(onnx.load(path)))
        for path in sorted(glob.glob(os.path.join(folder, "*.onnx")))
    }


def import_onnx(model: onnx.ModelProto) -> tvm.IRModule:
    """Import with static shapes for the graph inputs that are not initializers."""
    initializers = {init.name for init in model.graph.initializer}
    shape_dict = {
        inp.name: [dim.dim_value for dim in inp.type.tensor_type.shape.dim]
        for inp in model.graph.input
        if inp.name not in initializers
    }
    return from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)


def plain(value: object) -> object:
    """A JSON-ready Python value for an attr field or a non-tensor argument."""
    return to_python(value, _callee_or_text)


def _callee_or_text(value: object) -> object:
    """A callee by its name; None as None; anything else with no plain form as text."""
    if value is None:
        return None
    if isinstance(value, tvm.ir.GlobalVar):
        return value.name_hint
    if isinstance(value, relax.ExternFunc):
        return value.global_symbol
    if hasattr(value, "value"):
        return plain(value.value)
    return str(value)


def is_tensor_valued(expr: relax.Expr) -> bool:
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType):
        return True
    return isinstance(ty, relax.TupleType) and any(
        isinstance(field, relax.TensorType) for field in ty.fields
    )


def describe(call: relax.Call) -> str:
    """``k=v`` for every attr field and every non-tensor argument, in order."""
    parts = []
    if call.attrs is not None:
        for field in type(call.attrs).__tvm_ffi_type_info__.fields:
            parts.append(f"{field.name}={plain(getattr(call.attrs, field.name))}")
    for i, arg in enumerate(call.args):
        if isinstance(arg, tvm.ir.GenericConst):
            rank = len(arg.ty.shape)
            parts.append(f"arg{i}=const({f'{rank}d' if rank else 'scalar'})")
        elif not is_tensor_valued(arg):
            parts.append(f"arg{i}={plain(arg)}")
    return ", ".join(parts)


def callee_name(call: relax.Call) -> str:
    if isinstance(call.op, tvm.ir.Op):
        if call.op.name in CALLEE_FIRST:
            return f"{call.op.name}:{plain(call.args[0])}"
        return call.op.name
    return f"call:{plain(call.op)}"


def records(mod: tvm.IRModule) -> Iterator[tuple[str, str]]:
    """(callee, signature) per call in every Relax function; TupleGetItem counts too,
    because batch_norm and dropout return tuples that later code indexes into."""
    found: list[relax.Expr] = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, found.append)
    for expr in found:
        if isinstance(expr, relax.Call):
            yield callee_name(expr), describe(expr)
        elif isinstance(expr, relax.TupleGetItem):
            yield "<TupleGetItem>", f"index={expr.index}"


def inventory(models: dict[str, Callable[[], tvm.IRModule]]) -> tuple[dict, dict, dict]:
    """(model → {op: calls}, op → {signature → [models]}, model → import error)."""
    per_model: dict[str, dict[str, int]] = {}
    variants: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    failures: dict[str, str] = {}
    for name, load in models.items():
        try:
            mod = load()
        except Exception as err:  # noqa: BLE001  (report every failure, keep going)
            failures[name] = f"{type(err).__name__}: {err}".splitlines()[0]
            traceback.print_exc(limit=-3, file=sys.stderr)
            continue
        counts: Counter[str] = Counter()
        for op, signature in records(mod):
            counts[op] += 1
            variants[op][signature].add(name)
        per_model[name] = dict(sorted(counts.items()))
    union = {
        op: {sig: sorted(ms) for sig, ms in sorted(v.items())} for op, v in sorted(variants.items())
    }
    return per_model, union, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the full inventory here")
    parser.add_argument("--max-variants", type=int, default=12, help="signatures shown per op")
    args = parser.parse_args()

    models = {
        **light_models(),
        **{f"builtin:{k}": v for k, v in BUILTIN_MODELS.items() if not k.endswith("_small")},
    }
    per_model, union, failures = inventory(models)

    print("== ops per model")
    for name, ops in per_model.items():
        print(f"{name} ({len(ops)}): " + " ".join(f"{op}×{n}" for op, n in ops.items()))
    print(f"\n== union ({len(union)} ops)")
    for op, sigs in union.items():
        users = sorted({m for ms in sigs.values() for m in ms})
        print(f"\n{op}  [{len(users)} models: {', '.join(users)}]")
        for sig, ms in list(sigs.items())[: args.max_variants]:
            print(f"    ({sig or '-'})  <- {', '.join(ms)}")
        if len(sigs) > args.max_variants:
            print(f"    ... {len(sigs) - args.max_variants} more signatures")
    print("\n== import failures" + ("" if failures else ": none"))
    for name, why in failures.items():
        print(f"{name}: {why}")
    if args.json:
        args.json.write_text(
            json.dumps({"per_model": per_model, "union": union, "failures": failures}, indent=1)
        )


if __name__ == "__main__":
    main()
