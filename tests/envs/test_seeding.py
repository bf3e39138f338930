"""Fast seeding (tpo_gym.envs._seeding): the same words as numpy's generators, thousands at a time."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from gymnasium.utils import seeding

from tpo_gym.envs._seeding import LazyGenerator, first_raw_words, lazy_generators


def _real_first(seed: int) -> int:
    return int(seeding.np_random(seed)[0].bit_generator.random_raw())


def test_first_raw_words_equal_numpy_pcg64_for_thousands_of_seeds() -> None:
    rng = np.random.default_rng(123)
    seeds = [*range(1000), *(int(s) for s in rng.integers(0, 2**63, 1000)), 2**32 - 1, 2**32, 2**64 - 1,
             2**64, 2**100 + 12345, 2**128 - 1]
    got = first_raw_words(seeds)
    assert got.dtype == np.uint64 and got.shape == (len(seeds),)
    assert got.tolist() == [_real_first(s) for s in seeds]
    with pytest.raises(ValueError, match=r"\[0, 2\*\*128\)"):
        first_raw_words([2**128])


def test_a_lazy_generator_is_the_real_stream() -> None:
    for draw in ("raw", "integers", "state"):
        lazy, real = lazy_generators([7])[0], seeding.np_random(7)[0]
        assert lazy.bit_generator.random_raw() == real.bit_generator.random_raw()  # the precomputed word
        assert lazy._real is None, "nothing built for the first word"
        if draw == "raw":
            assert lazy.bit_generator.random_raw() == real.bit_generator.random_raw()
        elif draw == "integers":
            assert lazy.integers(1000, size=5).tolist() == real.integers(1000, size=5).tolist()
        else:
            assert lazy.bit_generator.state == real.bit_generator.state
        assert lazy.random(3).tolist() == real.random(3).tolist()
    untouched = LazyGenerator(9, _real_first(9))
    assert untouched.integers(10**9) == seeding.np_random(9)[0].integers(10**9), "building before the first word"


def test_lazy_generators_copy_and_pickle_with_their_state() -> None:
    gen = lazy_generators([11])[0]
    gen.bit_generator.random_raw()
    clone, unpickled = copy.deepcopy(gen), pickle.loads(pickle.dumps(gen))
    expected = seeding.np_random(11)[0]
    expected.bit_generator.random_raw()
    nxt = int(expected.bit_generator.random_raw())
    assert clone.bit_generator.random_raw() == nxt and unpickled.bit_generator.random_raw() == nxt
    assert gen.bit_generator.random_raw() == nxt, "copies are independent"
