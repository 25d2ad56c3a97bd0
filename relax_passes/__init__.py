"""Our Relax passes, one per module, usable in any TVM pipeline.

LiftEmits -> PropagateContracts -> (EliminateEmits, FuseEmits, MaterializeEmits)* -> LowerEmits
"""

from .eliminate_emits import EliminateEmits
from .fuse_emits import FuseEmits
from .lift_emits import LiftEmits
from .lower_emits import LowerEmits
from .materialize_emits import MaterializeEmits
from .propagate_contracts import PropagateContracts, analyze

__all__ = ["EliminateEmits", "MaterializeEmits", "FuseEmits", "LiftEmits", "LowerEmits", "PropagateContracts", "analyze"]
