"""The bottom layer: lattices, contracts, op kinds, facts, the Emit encoding, errors.

Imports TVM and nothing of ours above it; ``relax_passes`` and ``schedules`` build on it
(docs/design.md §8).
"""
