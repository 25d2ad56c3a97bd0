"""AICF on TVM: the Emit IR model (contract lattices, Emits in Relax) and its API.

The core values (lattices, contracts, Emit, errors: plain Python) load eagerly; the
rest of the public API loads on first use through ``_LAZY``: ``verify`` (Relax) and the
driver (``aicf_tvm.driver``: compile, frontends, load, tune, ...). That table is the
only place the core names the driver (docs/design.md §8; ``tests/test_imports.py``
allows exactly it), so ``import relax_passes`` and ``import schedules`` never pull the
driver in, and ``aicf_tvm.load`` works where TVM has only its runtime library.
"""

from .contract import (
    ADAM_STEP_CONTRACT, RELU_CONTRACT, ContractFacts, EmitContract, Entailment, PortFacts, entails,
)
from .emit import EMIT_ATTR, Emit, Interface, Port, emit_of
from .errors import (
    AicfError, AliasContradiction, ContractContradiction, ContractViolation, DeployError,
    EncodingError, InputError, KindRegistrationError, TargetError, TuningError,
    UnsupportedModelError,
)
from .version import __version__ as __version__
from .lattice import (
    ABIFact, AccumDtype, Alias, Alignment, Determinism, Effect, Flag, MathTag, NumericFact,
    Rounding, ShapeFact,
)

__all__ = [
    "ADAM_STEP_CONTRACT", "RELU_CONTRACT", "ContractFacts", "EmitContract", "Entailment", "PortFacts",
    "entails", "EMIT_ATTR", "Emit", "Interface", "Port", "emit_of", "AicfError", "AliasContradiction", "ContractContradiction",
    "ContractViolation", "DeployError", "EncodingError", "InputError", "KindRegistrationError", "TargetError", "TuningError",
    "UnsupportedModelError", "ABIFact", "AccumDtype", "Alias", "Alignment", "Determinism", "Effect",
    "Flag", "MathTag", "NumericFact", "Rounding", "ShapeFact",
]

_LAZY = {
    "contract_problems": ".verify",
    "verify_contracts": ".verify",
    "compile": ".driver.pipeline",
    "compile_optimizer_step": ".driver.optimizer",
    "CompiledModel": ".driver.compiled",
    "explain": ".driver.explainer",
    "from_onnx": ".driver.frontends",
    "from_torch": ".driver.frontends",
    "load_model": ".driver.frontends",
    "tune": ".driver.tuning",
    "TuneResult": ".driver.tuning",
    "load": ".driver.compiled",
}
__all__ += list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name], __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'aicf_tvm' has no attribute {name!r}")
