"""CUDA kernels that travel compiled: an exported library runs where no CUDA compiler is.

TVM 0.27 builds the CUDA module of a host without the CUDA runtime (a build host with nvcc
and no GPU, like CI) as *source*, format ``cuda``; the host that loads the library
compiles it then, through TVM's ``tvm_callback_cuda_compile`` hook (NVRTC or nvcc, and the
compiler half of TVM). A deploy host with TVM's runtime only has neither.

So our build (``precompiled``, around ``tvm.compile`` for a CUDA target) compiles that
source here with nvcc into a fatbin, the target's machine code plus its PTX (which a newer
GPU's driver compiles), and appends it to the source as a base64 comment. The module is
still a plain TVM CUDA source module, and any TVM with a compiler can load it as before;
``install_hook`` (which ``aicf_tvm.load`` calls) registers a compile hook that returns the
carried fatbin and hands every other source to the hook it replaced. Without nvcc on the
build host, or when nvcc fails, the source travels alone and a warning says so.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import shutil
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import tvm_ffi

from aicf_tvm.core.errors import DeployError

if TYPE_CHECKING:
    import tvm

COMPILE_HOOK = "tvm_callback_cuda_compile"
POSTPROC_HOOK = "tvm_callback_cuda_postproc"
MARK = "\n/* aicf-tvm fatbin, base64:\n"
END = "\n*/\n"
FATBIN_MAGIC = b"\x50\xed\x55\xba"  # nvcc's fatbin header; cuModuleLoadData takes it as is
_LINE = 100  # base64 characters per comment line

_state: dict[str, Any] = {"installed": False}


class CarriedBinaryError(DeployError, RuntimeError):
    """A source whose carried fatbin comment is damaged (never silently recompiled)."""


# raised inside the CUDA compile hook, which TVM calls from C++: registered, it keeps its type
tvm_ffi.register_error(CarriedBinaryError.__name__, CarriedBinaryError)


def carried_fatbin(source: str) -> bytes | None:
    """The fatbin that ``precompiled`` appended to ``source``; None for a plain source."""
    at = source.rfind(MARK)
    if at < 0:
        return None
    end = source.find(END, at + len(MARK))
    if end < 0:
        raise CarriedBinaryError("the CUDA module's carried fatbin is truncated (no end of comment)")
    try:
        blob = base64.b64decode("".join(source[at + len(MARK):end].split()), validate=True)
    except (binascii.Error, ValueError) as err:
        raise CarriedBinaryError(f"the CUDA module's carried fatbin is not valid base64 ({err})") from err
    if not blob.startswith(FATBIN_MAGIC):
        raise CarriedBinaryError("the CUDA module's carried binary is not a fatbin")
    return blob


def with_fatbin(source: str, fatbin: bytes) -> str:
    text = base64.b64encode(fatbin).decode()
    lines = "\n".join(text[i:i + _LINE] for i in range(0, len(text), _LINE))
    return f"{source}{MARK}{lines}{END}"


def install_hook() -> None:
    """Register the compile hook that returns a carried fatbin (once per process); any
    other source goes to the hook registered before (TVM's NVRTC/nvcc one, when present)."""
    if _state["installed"]:
        return
    previous = tvm_ffi.get_global_func(COMPILE_HOOK, allow_missing=True)

    def compile_hook(source: str) -> bytes:
        fatbin = carried_fatbin(source)
        if fatbin is not None:
            return fatbin
        if previous is None:
            raise RuntimeError("this CUDA module carries source only (built without nvcc) and this "
                               "process has no CUDA compiler hook: rebuild it where nvcc is installed")
        return previous(source)

    tvm_ffi.register_global_func(COMPILE_HOOK, compile_hook, override=True)
    _state["installed"] = True


def gencode(arch: str) -> list[str]:
    """nvcc's ``-gencode`` flags for ``sm_XY``: machine code for it and its PTX."""
    if not arch.startswith("sm_") or not arch[3:].rstrip("af").isdigit():
        raise ValueError(f"CUDA arch {arch!r}: expected sm_XY (e.g. sm_90)")
    version = arch[3:]
    return ["-gencode", f"arch=compute_{version},code=sm_{version}",
            "-gencode", f"arch=compute_{version},code=compute_{version}"]


def compile_fatbin(source: str, target: tvm.target.Target) -> bytes:
    """``source`` compiled by nvcc for ``target``'s arch (TVM's own nvcc driver)."""
    from tvm.support import nvcc  # the compiler side: build hosts only

    with target:
        return bytes(nvcc.compile_cuda(source, target_format="fatbin", arch=gencode(str(target.arch)),
                                       compiler="nvcc"))


@contextlib.contextmanager
def precompiled(target: tvm.target.Target) -> Iterator[None]:
    """Within: every CUDA module TVM builds carries its fatbin (see the module docstring)."""
    if target.kind.name != "cuda":
        yield
        return
    if shutil.which("nvcc") is None:
        warnings.warn("nvcc not found: the CUDA kernels are exported as source, which the host "
                      "that loads them must compile", RuntimeWarning, stacklevel=3)
        yield
        return
    install_hook()
    previous = tvm_ffi.get_global_func(POSTPROC_HOOK, allow_missing=True)

    def postproc(source: str, tgt: tvm.target.Target) -> str:
        if previous is not None:
            source = previous(source, tgt)
        try:
            return with_fatbin(source, compile_fatbin(source, tgt if getattr(tgt, "arch", None) else target))
        except Exception as err:  # noqa: BLE001 - the source still works where a compiler is
            warnings.warn(f"nvcc could not compile the CUDA kernels ({str(err).strip()[:300]}); "
                          "they are exported as source", RuntimeWarning, stacklevel=2)
            return source

    tvm_ffi.register_global_func(POSTPROC_HOOK, postproc, override=True)
    try:
        yield
    finally:
        if previous is not None:
            tvm_ffi.register_global_func(POSTPROC_HOOK, previous, override=True)
        else:
            tvm_ffi.registry.remove_global_func(POSTPROC_HOOK)
