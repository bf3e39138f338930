"""tpo_gym.envs._common: the context draws shared by single and native vector envs are uniform, in range and
seed-exact."""

from __future__ import annotations

import numpy as np
import pytest

from tpo_gym.envs._common import draw_tokens, draw_uniform, seed_generators


@pytest.mark.parametrize("n", [1, 2, 3, 10, 60000, 2**62])
def test_draw_uniform_range_and_balance(n: int) -> None:
    gens = seed_generators(0, 4000)
    codes = draw_uniform(gens, n)
    assert codes.dtype == np.int64 and codes.min() >= 0 and codes.max() < n
    if n in (2, 3, 10):  # counts within 5 sigma of uniform
        counts = np.bincount(codes, minlength=n)
        expected = 4000 / n
        assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_draws_are_per_generator_and_reproducible() -> None:
    a = draw_tokens(seed_generators(5, 3), vocab_size=4, length=10)
    b = np.concatenate([draw_tokens(seed_generators([5 + i], 1), 4, 10) for i in range(3)])
    np.testing.assert_array_equal(a, b)  # batched draw == one env at a time
    assert not np.array_equal(a[0], a[1])


@pytest.mark.parametrize(("vocab_size", "length"), [(2, 10), (16, 10), (3, 50), (2**40, 3)])
def test_draw_tokens_range_and_marginals(vocab_size: int, length: int) -> None:
    tokens = draw_tokens(seed_generators(1, 2000), vocab_size, length)
    assert tokens.shape == (2000, length) and tokens.min() >= 0 and tokens.max() < vocab_size
    if vocab_size <= 16:  # every position uniform
        for pos in range(length):
            counts = np.bincount(tokens[:, pos], minlength=vocab_size)
            expected = 2000 / vocab_size
            assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))
