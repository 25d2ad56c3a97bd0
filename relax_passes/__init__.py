"""Our Relax passes, one per module, usable in any TVM pipeline.

LiftEmits -> PropagateContracts -> (EliminateEmits, FuseEmits, MaterializeEmits)* -> LowerEmits
"""

from .lift_emits import LiftEmits
from .propagate_contracts import PropagateContracts, analyze

__all__ = ["LiftEmits", "PropagateContracts", "analyze"]
