"""The import cache: a PyTorch module imported once is read back, not decomposed and
translated again.

Most of ``from_torch``'s time comes after ``torch.export.export``: ``run_decompositions``
traces the whole program a second time, to core ATen (BERT-base: 1.9 of 3.3 s), then TVM
translates it and ``normalize_import`` folds it. All of that is a function of the program
``torch.export`` traced and of nothing else the module holds: its graph with each node's
target, arguments, shape, dtype, stride and device (``print_readable``, submodules
included), its signature, range constraints and input/output structure, the bytes, dtype,
shape and strides of its parameters, buffers and constants, the dims' names, and the
versions of PyTorch, TVM, tvm-ffi and our code (``compile_cache.versions``: the digest of
our sources). The key is the SHA-256 of all of these, so the trace itself still runs on
every call (it is what the key is made of: a key from the module's Python objects could
not see what its ``forward`` does), and whatever changes the imported module changes the
key. A program ``torch.export`` could not trace without ``draft_export``, or with a
constant that is not a plain CPU tensor, is not cached.

An entry (``<key>.import`` in the compile cache's folder, trimmed with its libraries)
is the imported module with its weights (``weights_apart.is_weight``) turned into extra
parameters of ``main``, serialized by TVM (``tvm.ir.save_json``: a few hundred kB, where
the module with its weights is a 600 MB text for BERT-base), then the weights' bytes
after it from a page boundary, each one's SHA-256 recorded (``runtime.mapped_weights``'s
layout). Reading it back maps the weights (no copy), checks every digest and binds them
in place of the parameters (``relax.transform.BindParams``): the module is structurally
equal to the one imported, and ``compile``'s cache finds its library by the same key.

``from_torch`` writes an entry in a thread of its own while the caller goes on (BERT-base:
440 MB, a second where the disk's write-back throttles the page cache).

Layout: ``AICF-IMPORT <format> <header bytes> <header SHA-256>\\n``, the header (JSON:
the module and the weights' metadata), zeros to a page boundary, the weights. A cut,
modified or unreadable entry is removed with a warning and the module imported again.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tvm
from tvm import relax
from tvm_ffi.serialization import from_json_graph_str

from aicf_tvm.core.errors import AicfError
from aicf_tvm.runtime import mapped_weights
from aicf_tvm.runtime.threads import on_every_cpu

from ..compile_cache import CompileCache, digest_of, used, versions
from ..merge import constants_of
from ..weights_apart import ReplaceWeights, is_weight

if TYPE_CHECKING:
    import torch

FORMAT = 1
SUFFIX = ".import"
MAGIC = b"AICF-IMPORT"
PREFIX = "aicf_import_weight"  # main's parameters that stand for its weights in an entry
_writing: list[threading.Thread] = []  # put's threads still writing


def torch_key(ep: torch.export.ExportedProgram, dim_names: dict[str, str]) -> str | None:
    """The key of the module ``from_torch`` imports from ``ep`` as traced (before its
    decomposition), its dims named by ``dim_names`` (module docstring); None where the
    program holds a constant that is not a plain CPU tensor (not cached)."""
    import torch

    state = [*ep.state_dict.items(), *ep.constants.items()]
    if not all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" and t.layout == torch.strided
               and not t.is_quantized for _, t in state):
        return None
    try:
        views = [t.detach().contiguous().reshape(-1).view(torch.uint8).numpy() for _, t in state]
    except (RuntimeError, TypeError):  # bytes torch will not show as uint8 (a conjugate view, say): not cached
        return None
    digests = on_every_cpu(lambda view: hashlib.sha256(view).hexdigest(), views)
    return digest_of({
        "format": FORMAT, **versions(), "torch": torch.__version__,
        "program": ep.graph_module.print_readable(print_output=False, include_stride=True, include_device=True),
        "signature": repr(ep.graph_signature), "ranges": repr(ep.range_constraints), "call_spec": repr(ep.call_spec),
        "dims": dim_names,
        "state": [[name, str(t.dtype), list(t.shape), list(t.stride()), d] for (name, t), d in zip(state, digests)],
    })


def put(store: CompileCache, key: str, mod: tvm.IRModule, background: bool = False) -> bool:
    """Write ``mod`` as entry ``key`` (module docstring), in a thread of its own with
    ``background`` (``wait`` waits for it); False where it is not written (a function
    other than ``main`` holds a weight). A folder that cannot be written warns."""
    apart = _weights_apart(mod)
    if apart is None:
        return False
    lifted, weights = apart
    module = tvm.ir.save_json(lifted)

    def write() -> None:
        info, views = mapped_weights.describe(weights)
        header = json.dumps({"module": module, "weights": info}).encode()

        def fill(path: str) -> None:
            with open(path, "wb") as f:
                f.write(b"%s %d %d %s\n" % (MAGIC, FORMAT, len(header), hashlib.sha256(header).hexdigest().encode()))
                f.write(header)
            mapped_weights.pad_to_page(path)
            mapped_weights.append(path, info, views)

        try:
            store.write(key, SUFFIX, fill)
        except OSError as err:  # the disk full, say: the temporary file is gone
            warnings.warn(f"aicf compile cache: cannot write in {store.root} ({err}); not cached", stacklevel=2)

    if not background:
        write()
        return True
    # the weights are constants (read-only): the thread writes them while the caller
    # compiles; the interpreter waits for it at exit, so an entry is whole or absent
    thread = threading.Thread(target=write, name=f"aicf-import-cache-{key[:12]}")
    thread.start()
    _writing[:] = [t for t in _writing if t.is_alive()] + [thread]
    return True


def wait() -> None:
    """Return once every entry ``put`` writes in the background is written."""
    while _writing:
        _writing.pop().join()


def get(store: CompileCache, key: str) -> tvm.IRModule | None:
    """The module of entry ``key``, its weights mapped and checked; None when there is
    none, and when it is unusable (removed, with a warning)."""
    path = store.path(key, SUFFIX)
    try:
        mod = _read(path)
    except FileNotFoundError:
        return None
    except (AicfError, OSError, ValueError, KeyError) as err:
        warnings.warn(f"aicf compile cache: {path} is unusable ({err}); importing again", stacklevel=3)
        path.unlink(missing_ok=True)
        return None
    used(path)
    return mod


def _read(path: Path) -> tvm.IRModule:
    name = str(path)
    with open(path, "rb") as f:
        line = f.readline(256).split()
        if len(line) != 4 or line[0] != MAGIC or line[1] != b"%d" % FORMAT:
            raise AicfError("not an import entry of this version")
        header = f.read(int(line[2]))
        head_end = f.tell()
        length = os.fstat(f.fileno()).st_size
        if hashlib.sha256(header).hexdigest().encode() != line[3]:
            raise AicfError("its header was modified or cut")
        meta = json.loads(header)
        mapped_weights.code_end(name, length, head_end, meta)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            mapped_weights.check(name, data, meta)
    weights = mapped_weights.map_weights(name, meta) or []
    lifted = from_json_graph_str(meta["module"])  # TVM's version is in the key: nothing to upgrade
    return relax.transform.BindParams("main", {f"{PREFIX}{i}": w for i, w in enumerate(weights)})(lifted)


def _weights_apart(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[tvm.runtime.Tensor]] | None:
    """``mod`` with main's weights as its last parameters (``PREFIX``), and the weights;
    None where another function holds one or a parameter has the name."""
    main = mod["main"] if "main" in [gv.name_hint for gv in mod.get_global_vars()] else None
    if not isinstance(main, relax.Function) or any(p.name.startswith(PREFIX) for p in main.params):
        return None
    others = [f for gv, f in mod.functions_items() if gv.name_hint != "main" and isinstance(f, relax.Function)]
    if any(is_weight(c) for f in others for c in constants_of(f)):
        return None
    bound: dict[Any, relax.Var] = {}
    weights: list[tvm.runtime.Tensor] = []
    for const in constants_of(main):
        if is_weight(const) and const.value not in bound:
            bound[const.value] = relax.Var(f"{PREFIX}{len(weights)}",
                                           relax.TensorType(const.value.shape, str(const.value.dtype)))
            weights.append(const.value)
    body = ReplaceWeights(bound).visit_expr(main.body)
    lifted = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    lifted["main"] = relax.Function([*main.params, *bound.values()], body, main.ret_ty, main.is_pure,
                                    main.attrs, main.span)
    return lifted, weights


__all__ = ["SUFFIX", "get", "put", "torch_key", "wait"]
