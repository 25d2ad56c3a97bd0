"""A library's weights after its code, mapped at load (format 2 of ``deploy``).

The executable takes the weights as its entry functions' last argument
(``driver.weights_apart``), so they need not pass through TVM's serializer, the
assembler, the linker and TVM's deserializer, each a copy of every byte. The file is the
linked library (ELF), zeros up to a page boundary, then each weight's bytes at its offset
(``ALIGN``-byte aligned, as TVM aligns what it allocates); the weights' region is the
file's last ``size`` bytes. The metadata (inside the ELF, under the file's digest) lists
each weight's shape, dtype, offset, byte count and SHA-256.

Loading maps the region copy-on-write (``MAP_PRIVATE``: a write could not reach the file,
and no kernel writes a weight: their ports are read-only) and populated at once
(``MAP_POPULATE``: the first call takes no page faults); each weight is a TVM tensor over
its mapped bytes (DLPack, no copy), so processes that load one library share one copy of
its weights, the page cache's.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from aicf_tvm.core.errors import DeployError

from .threads import on_every_cpu

PAGE = 4096  # the region starts on a page: its mapping's offsets are the file's
ALIGN = 64


def byte_view(tensor: tvm.runtime.Tensor) -> np.ndarray:
    """A CPU tensor's bytes as uint8, its own memory (a dtype numpy has: ``weights_apart``
    lifts no other)."""
    return np.from_dlpack(tensor).reshape(-1).view(np.uint8)


def _sha256(data: Any) -> str:
    return hashlib.sha256(data).hexdigest()


def describe(weights: Sequence[tvm.runtime.Tensor]) -> tuple[dict, list[np.ndarray]]:
    """The metadata of ``weights`` (size, and per weight shape, dtype, offset, bytes,
    SHA-256) and their bytes to write."""
    views = [byte_view(w) for w in weights]
    entries, at = [], 0
    for weight, view, digest in zip(weights, views, on_every_cpu(_sha256, views)):
        at = -(-at // ALIGN) * ALIGN
        entries.append({"shape": [int(d) for d in weight.shape], "dtype": str(weight.dtype), "offset": at,
                        "nbytes": int(view.size), "sha256": digest})
        at += int(view.size)
    return {"size": at, "tensors": entries}, views


def pad_to_page(path: os.PathLike | str) -> None:
    """Zeros after the library's code up to the next page boundary."""
    with open(path, "ab") as f:
        f.write(b"\0" * (-f.tell() % PAGE))


def append(path: os.PathLike | str, info: dict, views: Sequence[np.ndarray]) -> None:
    """Write the weights' region (``describe``) after the padded library."""
    with open(path, "ab") as f:
        start = f.tell()
        for entry, view in zip(info["tensors"], views):
            f.write(b"\0" * (start + entry["offset"] - f.tell()))
            f.write(view.data)


def code_end(name: str, length: int, elf_end: int, meta: dict) -> int:
    """Where the weights' region of a file of ``length`` bytes whose ELF headers place
    code up to ``elf_end`` starts (``length`` where it has none); ``DeployError`` where
    the file cannot hold it as recorded."""
    info = meta.get("weights")
    if not info:
        return length
    size, least = int(info["size"]), -(-elf_end // PAGE) * PAGE
    if length < least + size:
        raise DeployError(f"{name}: corrupt file (truncated: {length} bytes, its code and {size} bytes of weights "
                          f"need {least + size}); export it again or copy it whole")
    if (length - size) % PAGE:
        raise DeployError(f"{name}: corrupt file (its {size} bytes of weights do not start on a page: "
                          f"modified after export); export it again or copy it whole")
    return length - size


def check(name: str, data: Any, meta: dict) -> None:
    """``DeployError`` unless every weight's bytes in ``data`` (the file's) have the
    SHA-256 recorded."""
    info = meta.get("weights")
    if not info:
        return
    start = len(data) - int(info["size"])  # ``code_end`` checked it
    with memoryview(data) as view:
        regions = [view[start + e["offset"]:start + e["offset"] + e["nbytes"]] for e in info["tensors"]]
        try:
            digests = on_every_cpu(_sha256, regions)
        finally:
            for region in regions:
                region.release()
    for at, (entry, digest) in enumerate(zip(info["tensors"], digests)):
        if digest != entry["sha256"]:
            raise DeployError(f"{name}: corrupt file (weight {at} of {len(digests)}, {entry['dtype']}"
                              f"{entry['shape']}, was modified after export)")


def map_weights(name: str, meta: dict) -> Any:
    """The weights of the library at ``name`` (its digests checked, ``check``) as a tuple
    of TVM tensors over its mapped bytes (module docstring), what its functions take last;
    None where it has none."""
    info = meta.get("weights")
    if not info:
        return None
    with open(name, "rb") as f:
        length = os.fstat(f.fileno()).st_size
        start = code_end(name, length, 0, meta)  # the code's own end: its digest, checked beside this
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(f.fileno(), length - start, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE,
                           offset=start)
    tensors = []
    for entry in info["tensors"]:
        dtype = np.dtype(entry["dtype"])
        count = entry["nbytes"] // dtype.itemsize
        array = np.frombuffer(mapped, dtype, count, entry["offset"]).reshape(entry["shape"])
        tensors.append(tvm.runtime.from_dlpack(array))  # keeps the array, and so the mapping, alive
    return tvm_ffi.convert(tensors)


__all__ = ["ALIGN", "PAGE", "append", "byte_view", "check", "code_end", "describe", "map_weights", "pad_to_page"]
