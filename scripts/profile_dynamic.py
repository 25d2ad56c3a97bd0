"""Where a dynamic-shape compile loses to a static one, kernel by kernel.

Usage::

    python -m scripts.profile_dynamic [--model bert|llama] [--small] [--batch 1] [--seq 64]
                                      [--top 30]

Compiles the model of ``scripts/bench_dynamic.py`` (``harness.text_model``) twice (dynamic ``batch``/``seq`` and
static at ``--batch x --seq``), runs each once on the same inputs under a VM instrument and
times every call where it happens, with the arguments the VM passes it: a kernel is called
again (best of a few ~5 ms rounds), a VM builtin (shape checks, allocation) is timed once per
call, Python's callback overhead included (a few microseconds: compare counts more than
times). Kernels are paired by kind and order of appearance; the table lists the pairs by the
time the dynamic one loses, with each side's schedule, then the builtins' totals.
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

from scripts import harness


def profile_run(compiled: Any, arrays: list) -> list[tuple[str, float]]:
    """``[(symbol, seconds)]`` for every VM call of one run of ``main``, in order."""
    from tvm.runtime.vm import VirtualMachine, VMInstrumentReturnKind

    from aicf_tvm.runtime.compiled import to_device
    from aicf_tvm.runtime.threads import use_threads

    kernels = {k.name for k in compiled.kernels}
    use_threads(compiled.threads)
    vm = VirtualMachine(compiled.executable, compiled.device)  # its own: the instrument stays on it
    calls: list[tuple[str, float]] = []
    started: list[float] = []

    def instrument(func: Any, symbol: str, before: bool, _ret: Any, *args: Any) -> int:
        if symbol in kernels and before:
            func(*args)
            best = float("inf")
            for _ in range(3):
                count, start = 0, time.perf_counter()
                while count < 3 or time.perf_counter() - start < 5e-3:
                    func(*args)
                    count += 1
                best = min(best, (time.perf_counter() - start) / count)
            calls.append((symbol, best))
        elif symbol not in kernels:
            if before:
                started.append(time.perf_counter())
            else:
                calls.append((symbol, time.perf_counter() - started.pop()))
        return int(VMInstrumentReturnKind.NO_OP)

    vm.set_instrument(instrument)
    vm["main"](*[to_device(a, compiled.device)[0] for a in arrays], *compiled.weights_args)
    return calls


def pair_kernels(compiled: Any, calls: list[tuple[str, float]]) -> dict[tuple[str, int], tuple[str, str, float]]:
    """``{(kind, nth of that kind): (kernel, schedule, seconds)}`` of the kernel calls."""
    info = {k.name: (k.kind, k.schedule) for k in compiled.kernels}
    seen: collections.Counter = collections.Counter()
    out = {}
    for symbol, secs in calls:
        if symbol not in info:
            continue
        kind, schedule = info[symbol]
        out[(kind, seen[kind])] = (symbol, schedule, secs)
        seen[kind] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert", choices=["bert", "llama"])
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    model = harness.text_model(args.model, args.small)
    ids, mask = harness.token_inputs(model, args.batch, args.seq, 0)
    dynamic = harness.compile_text(model, harness.token_inputs(model, 2, 16, 0), dynamic=True)
    static = harness.compile_text(model, (ids, mask), dynamic=False)
    arrays = [ids.numpy(), mask.numpy()]
    runs = {name: profile_run(c, arrays) for name, c in (("dynamic", dynamic), ("static", static))}
    pairs = {name: pair_kernels(c, runs[name]) for name, c in (("dynamic", dynamic), ("static", static))}
    keys = sorted(set(pairs["dynamic"]) | set(pairs["static"]),
                  key=lambda k: -(pairs["dynamic"].get(k, ("", "", 0.0))[2] - pairs["static"].get(k, ("", "", 0.0))[2]))
    print(f"{'kind':26s} {'dynamic kernel':34s} {'schedule':10s} {'dyn ms':>8s} {'static ms':>9s} "
          f"{'schedule':10s} {'ratio':>6s}")
    for key in keys[: args.top]:
        d_name, d_sched, d = pairs["dynamic"].get(key, ("-", "-", 0.0))
        _, s_sched, s = pairs["static"].get(key, ("-", "-", 0.0))
        ratio = f"{d / s:6.2f}" if s > 0 else "     -"
        print(f"{key[0]:26s} {d_name[:34]:34s} {d_sched:10s} {d * 1e3:8.3f} {s * 1e3:9.3f} {s_sched:10s} {ratio}")
    for name, c in (("dynamic", dynamic), ("static", static)):
        kernel_names = {k.name for k in c.kernels}
        kern = sum(s for sym, s in runs[name] if sym in kernel_names)
        builtins: collections.Counter = collections.Counter()
        counts: collections.Counter = collections.Counter()
        for sym, secs in runs[name]:
            if sym not in kernel_names:
                builtins[sym] += secs
                counts[sym] += 1
        calls = sum(1 for sym, _ in runs[name] if sym in kernel_names)
        print(f"{name}: {calls} kernel calls, {kern * 1e3:.2f} ms in kernels; VM calls: "
              + ", ".join(f"{sym} x{counts[sym]} {builtins[sym] * 1e3:.3f} ms"
                          for sym, _ in builtins.most_common(6)))
    for name, c in (("dynamic", dynamic), ("static", static)):
        secs = harness.best_seconds(lambda c=c: c(*arrays), 3)
        print(f"{name}: end to end {secs * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
