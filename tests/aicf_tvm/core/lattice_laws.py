"""One reusable law suite for every lattice (docs/design.md §3).

Subclass ``LatticeLaws`` and set ``values`` to a hypothesis strategy of elements;
set ``has_bottom = False`` for lattices without a finite ⊥.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


class LatticeLaws:
    values: st.SearchStrategy
    has_bottom = True

    @classmethod
    def _cls(cls, a):
        return type(a)

    def test_join_meet_commutative(self):
        @settings(max_examples=150, deadline=None)
        @given(self.values, self.values)
        def check(a, b):
            assert a.join(b) == b.join(a)
            assert a.meet(b) == b.meet(a)

        check()

    def test_join_meet_associative(self):
        @settings(max_examples=150, deadline=None)
        @given(self.values, self.values, self.values)
        def check(a, b, c):
            assert a.join(b).join(c) == a.join(b.join(c))
            assert a.meet(b).meet(c) == a.meet(b.meet(c))

        check()

    def test_idempotent(self):
        @settings(max_examples=100, deadline=None)
        @given(self.values)
        def check(a):
            assert a.join(a) == a
            assert a.meet(a) == a

        check()

    def test_absorption(self):
        @settings(max_examples=150, deadline=None)
        @given(self.values, self.values)
        def check(a, b):
            assert a.join(a.meet(b)) == a
            assert a.meet(a.join(b)) == a

        check()

    def test_top_bottom_identities(self):
        @settings(max_examples=100, deadline=None)
        @given(self.values)
        def check(a):
            top = type(a).top()
            assert a.join(top) == top and a.meet(top) == a and a.leq(top)
            if self.has_bottom:
                bot = type(a).bottom()
                assert a.join(bot) == a and a.meet(bot) == bot and bot.leq(a)

        check()

    def test_leq_agrees_with_join_and_meet(self):
        @settings(max_examples=200, deadline=None)
        @given(self.values, self.values)
        def check(a, b):
            assert a.leq(b) == (a.join(b) == b)
            assert a.leq(b) == (a.meet(b) == a)

        check()

    def test_leq_is_a_partial_order(self):
        @settings(max_examples=150, deadline=None)
        @given(self.values, self.values, self.values)
        def check(a, b, c):
            assert a.leq(a)
            if a.leq(b) and b.leq(a):
                assert a == b
            if a.leq(b) and b.leq(c):
                assert a.leq(c)

        check()

    def test_equal_values_hash_equal(self):
        @settings(max_examples=100, deadline=None)
        @given(self.values, self.values)
        def check(a, b):
            if a == b:
                assert hash(a) == hash(b)
            assert hash(a.join(b)) == hash(b.join(a))

        check()

    def test_json_round_trip(self):
        @settings(max_examples=100, deadline=None)
        @given(self.values)
        def check(a):
            assert type(a).from_json(a.to_json()) == a

        check()
