r"""Many seeded generators, fast: the first word of ``seeding.np_random(seed)`` for thousands of seeds at once.

A native vector env seeds sub-env ``i`` with ``seeding.np_random(seed + i)`` (as ``SyncVectorEnv``
does) and, at a reset, draws one context from each, usually one 64-bit word. Building a numpy
generator costs about 10-30 us (``SeedSequence`` hashing, ``PCG64`` set-up), which dominates a reset of
tens of thousands of sub-envs (S seeds x N sub-envs of a seed-batched rollout). :func:`first_raw_words`
computes the first ``random_raw()`` word of ``PCG64(SeedSequence(seed))`` for an array of seeds with
array operations (numpy's ``SeedSequence`` mixing on 32-bit words, then ``PCG64``'s seeding and one
XSL-RR output in 128-bit arithmetic on two 64-bit limbs), and :class:`LazyGenerator` stands for the
generator, handing out that word first and building the real one only if more is asked of it. Every
value is the one the real generators give (the tests compare them over thousands of seeds).

``PCG64`` (O'Neill's PCG-XSL-RR 128/64, numpy's default bit generator): state update
:math:`s \leftarrow s\,M + c \bmod 2^{128}`, seeded as :math:`s_0 = 0`, :math:`c = 2\,\mathrm{seq} + 1`,
one step, :math:`s \mathrel{+}= \mathrm{init}`, one step; output
:math:`\mathrm{rotr}_{64}(\mathrm{hi}(s) \oplus \mathrm{lo}(s),\ s \gg 122)` after a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.utils import seeding

__all__ = ["LazyGenerator", "first_raw_words", "lazy_generators"]

_U = np.uint64
_M32 = _U(0xFFFFFFFF)
# numpy.random.SeedSequence's hashing constants (pool of four 32-bit words)
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = _U(0xCA01F9DD), _U(0x4973F715)
# PCG64's default 128-bit multiplier, as (high, low) 64-bit halves
_PCG_HI, _PCG_LO = _U(2549297995355413924), _U(4865540595714422341)


def _mul64(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The full 128-bit product of uint64 arrays, as (high, low) halves."""
    a0, a1, b0, b1 = a & _M32, a >> _U(32), b & _M32, b >> _U(32)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> _U(32)) + (p01 & _M32) + (p10 & _M32)
    return p11 + (p01 >> _U(32)) + (p10 >> _U(32)) + (mid >> _U(32)), (p00 & _M32) | ((mid & _M32) << _U(32))


def _pcg_step(hi: np.ndarray, lo: np.ndarray, inc_hi: np.ndarray, inc_lo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``s * M + c mod 2**128`` on (high, low) halves."""
    phi, plo = _mul64(lo, np.broadcast_to(_PCG_LO, lo.shape))
    phi = phi + hi * _PCG_LO + lo * _PCG_HI
    out_lo = plo + inc_lo
    return phi + inc_hi + (out_lo < plo).astype(np.uint64), out_lo


def _seed_words(seeds: Sequence[int]) -> list[np.ndarray]:
    """The four little-endian 32-bit words of each seed (seeds in ``[0, 2**128)``)."""
    if all(0 <= int(s) < 2**64 for s in seeds):
        arr = np.asarray([int(s) for s in seeds], dtype=np.uint64)
        zero = np.zeros_like(arr)
        return [arr & _M32, arr >> _U(32), zero, zero]
    if any(not 0 <= int(s) < 2**128 for s in seeds):
        raise ValueError("first_raw_words takes seeds in [0, 2**128)")
    return [np.asarray([(int(s) >> (32 * i)) & 0xFFFFFFFF for s in seeds], dtype=np.uint64) for i in range(4)]


def first_raw_words(seeds: Sequence[int]) -> np.ndarray:
    """``uint64 [len(seeds)]``: ``seeding.np_random(s)[0].bit_generator.random_raw()`` for each seed ``s``.

    ``seeding.np_random(s)`` is ``Generator(PCG64(SeedSequence(s)))``: ``SeedSequence`` hashes the seed's
    32-bit words into a pool of four (zero-padded, so short seeds need no special case) and
    ``generate_state(4, uint64)`` gives PCG64's 128-bit initial state and stream.
    """
    words = _seed_words(seeds)
    h = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal h
        value = value ^ _U(h)
        h = (h * _MULT_A) & 0xFFFFFFFF
        value = (value * _U(h)) & _M32
        return value ^ (value >> _U(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = (_MIX_L * x - _MIX_R * y) & _M32
        return r ^ (r >> _U(16))

    with np.errstate(over="ignore"):
        pool = [hashmix(w) for w in words]
        for i_src in range(4):
            for i_dst in range(4):
                if i_src != i_dst:
                    pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))
        hb, state = _INIT_B, []
        for i in range(8):  # generate_state(4, uint64): eight 32-bit words, pairs little-endian
            v = pool[i % 4] ^ _U(hb)
            hb = (hb * _MULT_B) & 0xFFFFFFFF
            v = (v * _U(hb)) & _M32
            state.append(v ^ (v >> _U(16)))
        init_hi, init_lo, seq_hi, seq_lo = ((state[2 * j + 1] << _U(32)) | state[2 * j] for j in range(4))
        inc_hi, inc_lo = (seq_hi << _U(1)) | (seq_lo >> _U(63)), (seq_lo << _U(1)) | _U(1)
        lo = inc_lo + init_lo  # step from 0 (= the increment), then += the initial state
        hi = inc_hi + init_hi + (lo < inc_lo).astype(np.uint64)
        hi, lo = _pcg_step(hi, lo, inc_hi, inc_lo)
        hi, lo = _pcg_step(hi, lo, inc_hi, inc_lo)  # random_raw: a step, then the output
        x, rot = hi ^ lo, hi >> _U(58)
        return (x >> rot) | (x << ((_U(64) - rot) & _U(63)))


class _LazyBits:
    """The ``bit_generator`` of a :class:`LazyGenerator`."""

    __slots__ = ("_owner",)

    def __init__(self, owner: LazyGenerator) -> None:
        self._owner = owner

    def random_raw(self, size: Any = None, output: bool = True) -> Any:
        owner = self._owner
        if size is None and output and owner._real is None and not owner._used:
            owner._used = True
            return int(owner._first)
        return owner.real().bit_generator.random_raw(size, output)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_owner":
            raise AttributeError(name)
        return getattr(self._owner.real().bit_generator, name)


class LazyGenerator:
    """``seeding.np_random(seed)[0]``, built only when more than its first raw word is asked of it.

    ``bit_generator.random_raw()`` returns the precomputed first word; anything else (a second word,
    ``integers``, ``bit_generator.state`` ...) builds the real generator, advanced past the words
    already handed out, and delegates to it from then on.
    """

    __slots__ = ("seed", "_first", "_used", "_real")

    def __init__(self, seed: int, first: int) -> None:
        self.seed, self._first, self._used, self._real = seed, first, False, None

    @property
    def bit_generator(self) -> Any:
        """The bit generator: its ``random_raw()`` gives the precomputed word first."""
        return _LazyBits(self)

    def real(self) -> np.random.Generator:
        """The real generator (built now if needed, in the same state)."""
        if self._real is None:
            self._real = seeding.np_random(self.seed)[0]
            if self._used:
                self._real.bit_generator.random_raw()
        return self._real

    def __getattr__(self, name: str) -> Any:  # only for names not defined here: the real generator's
        if name.startswith("__") or name in LazyGenerator.__slots__:
            raise AttributeError(name)
        return getattr(self.real(), name)

    def __reduce__(self) -> tuple[Any, ...]:  # copy / deepcopy / pickle keep the laziness and the state
        return (_restore, (self.seed, self._first, self._used, self._real))


def _restore(seed: int, first: int, used: bool, real: np.random.Generator | None) -> LazyGenerator:
    gen = LazyGenerator(seed, first)
    gen._used, gen._real = used, real
    return gen


def lazy_generators(seeds: Sequence[int]) -> list[LazyGenerator]:
    """One :class:`LazyGenerator` per seed, their first words computed together."""
    firsts = first_raw_words(seeds).tolist()
    return [LazyGenerator(s, f) for s, f in zip(seeds, firsts, strict=True)]

