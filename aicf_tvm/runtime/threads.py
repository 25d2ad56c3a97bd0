"""TVM's CPU thread pool, sized to the CPUs this process may use.

TVM's runtime sizes its pool at ``hardware_concurrency / 2`` on x86 (it assumes two
hyper-threads per core): one thread on a 2-vCPU machine, half of every VM's CPUs. We
size it instead with the runtime's own ``runtime.config_threadpool`` (libtvm_runtime,
so it works without the compiler library) before a model first runs.

Both the pool and its bound (``MaxConcurrency``) are ``thread_local`` in TVM's runtime
(threading_backend.cc, thread_pool.cc): a Python thread that runs a model is sized on its
first call, and a pool created before that keeps its worker count as an upper bound.

The count, first that applies: an explicit ``threads``; ``TVM_NUM_THREADS``; the CPUs of
this process's affinity mask, capped by the target's ``num-cores`` when it has one.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import tvm  # loads libtvm_runtime, which registers runtime.config_threadpool
import tvm_ffi

from aicf_tvm.core.errors import InputError

# ThreadGroup::AffinityMode::kSpecifyThreadShareAllCore: every worker (and the calling
# thread) may run on every CPU listed, so the caller's own affinity is left as it was.
_SHARE_ALL_CORES = -3
_sized = threading.local()


def available_cpus() -> list[int]:
    """The CPU ids this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def on_every_cpu(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    """``fn`` over ``items`` in order, by one thread per usable CPU (at most one per item):
    for work that releases the GIL, such as TVM's builds and LLVM's code generation."""
    items = list(items)
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(min(len(items), len(available_cpus()))) as pool:
        return list(pool.map(fn, items))


def _positive(value: Any, what: str) -> int:
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count <= 0 or (not isinstance(value, str) and count != value):
        raise InputError(f"{what}={value!r}: expected a positive number of threads")
    return count


def thread_count(threads: int | None = None, target: Mapping[str, Any] | None = None) -> int:
    """Threads a model runs with: ``threads``, else ``TVM_NUM_THREADS``, else the usable
    CPUs capped by the ``num-cores`` of ``target`` (a target dict, as exported)."""
    if threads is not None:
        return _positive(threads, "threads")
    env = os.environ.get("TVM_NUM_THREADS", "").strip()
    if env:
        return _positive(env, "TVM_NUM_THREADS")
    count = len(available_cpus())
    cores = (target or {}).get("num-cores")
    return max(1, min(count, int(cores))) if cores else count


def use_threads(count: int) -> int:
    """Size the calling thread's TVM pool to ``count`` threads (once per thread and count).

    Returns the count the runtime reports; it is lower when this thread's pool was
    created with fewer workers before (e.g. by ``tvm.runtime.num_threads()``)."""
    if getattr(_sized, "count", None) == count:
        return count
    cpus = available_cpus()
    # The runtime bounds the pool by the length of this list: repeat CPUs to allow more
    # threads than CPUs; the distinct ids are the CPUs the workers may use.
    ids = [str(cpus[i % len(cpus)]) for i in range(max(count, len(cpus)))]
    tvm_ffi.get_global_func("runtime.config_threadpool")(_SHARE_ALL_CORES, count, ids)
    got = int(tvm.runtime.num_threads())
    _sized.count = count
    if got < count:
        warnings.warn(f"TVM's thread pool of this thread was created with {got} workers before "
                      f"aicf_tvm sized it; running with {got} threads instead of {count}",
                      RuntimeWarning, stacklevel=2)
    return got
