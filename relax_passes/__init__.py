"""Our Relax passes, one per module, usable in any TVM pipeline.

LiftEmits -> PropagateContracts -> (EliminateEmits, FuseEmits, MaterializeEmits)* -> LowerEmits
"""

from .fuse_emits import FuseEmits
from .lift_emits import LiftEmits
from .lower_emits import LowerEmits
from .propagate_contracts import PropagateContracts, analyze

__all__ = ["FuseEmits", "LiftEmits", "LowerEmits", "PropagateContracts", "analyze"]
