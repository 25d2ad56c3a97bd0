"""AICF on TVM: the Emit IR model (contract lattices, Emits in Relax) and its API.

The core values (lattices, contracts, Emit, errors: plain Python) load eagerly; what
needs TVM (verify, compile, frontends, deploy, CLI) loads on first use, so that
``import relax_passes`` and ``import schedules`` never pull the driver in, and
``aicf_tvm.load`` works where TVM has only its runtime library (no Relax, no compiler).
"""

from .contract import (
    ADAM_STEP_CONTRACT, RELU_CONTRACT, ContractFacts, EmitContract, Entailment, PortFacts, entails,
)
from .emit import EMIT_ATTR, Emit, Interface, Port, emit_of
from .errors import (
    AicfError, AliasContradiction, ContractContradiction, ContractViolation, DeployError,
    EncodingError, InputError, TargetError, TuningError, UnsupportedModelError,
)
from .lattice import (
    ABIFact, AccumDtype, Alias, Alignment, Determinism, Effect, Flag, MathTag, NumericFact,
    Rounding, ShapeFact,
)

__version__ = "0.1.0"

__all__ = [
    "ADAM_STEP_CONTRACT", "RELU_CONTRACT", "ContractFacts", "EmitContract", "Entailment", "PortFacts",
    "entails", "EMIT_ATTR", "Emit", "Interface", "Port", "emit_of", "AicfError", "AliasContradiction", "ContractContradiction",
    "ContractViolation", "DeployError", "EncodingError", "InputError", "TargetError", "TuningError",
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
    "load": ".driver.deploy",
}
__all__ += list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name], __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'aicf_tvm' has no attribute {name!r}")
