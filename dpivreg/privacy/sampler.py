"""Where the privacy noise comes from: a secure sampler by default, numpy's generator when a seed is given.

``seed=None`` (the default of every fit) gives a :class:`SecureGenerator`: each Gaussian release is made exactly
on a public grid. The query is rounded to the grid (γ·round(q/γ)) and an exact discrete Gaussian draw on the same
grid is added (Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy", Algorithms 1-3),
sampled with integer arithmetic from the operating system's cryptographically secure source (``os.urandom``). No
floating-point noise is drawn, so the released bits carry no trace of a floating-point sampler (Mironov 2012; Jin
et al. 2022): the released value is a function of two integers, the rounded query and the noise.

The grid and the accounting (:func:`calibrate`). For a release of dimension d with L2 sensitivity Δ and noise σ
the grid γ is the power of two at or below c·Δ/√d, c = :data:`GRID_FRACTION` (2⁻³⁰). Rounding moves each coordinate
by at most γ/2, so the rounded queries of two neighbours differ by at most Δ′ = Δ + γ√d ≤ Δ(1 + c) in L2 norm, an
integer vector in units of γ. Discrete Gaussian noise of parameter σ′/γ per coordinate on an integer shift of L2 norm
Δ′/γ has Rényi divergence at most α·Δ′²/(2σ′²) (ibid., the discrete Gaussian's concentrated-DP bound, the continuous
one; independent coordinates add up). With σ′ = σ·Δ′/Δ the release spends exactly Δ²/(2σ²), what the continuous
calibration spends: the grid costs at most 1 + 2⁻³⁰ of noise and nothing of the budget. The release records show
Δ′, σ′ and γ. The released value is (m + Z)·γ with m = round(q/γ) and Z the noise, added as integers: a function of
the integer m + Z alone (:func:`add_noise`).

A seed (an integer, a ``SeedSequence`` or a ``Generator``) gives numpy's Gaussian sampler instead, reproducible bit
for bit, for tests, documentation and replication inside the secure room. Its noise is the idealised Gaussian
mechanism's only up to floating point, and whoever knows the seed can remove it: the fit says "seeded" wherever it
reports its privacy (``res.privacy.sampler``, the summary's budget block, the release record).

Non-privacy randomness (the simulations of the noise, the privacy units' truncation keys) comes from the
generator's numpy stream in both cases; a :class:`SecureGenerator` seeds it from the operating system.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = ["GRID_FRACTION", "SAMPLERS", "SecureGenerator", "Calibration", "make_rng", "sampler_of", "calibrate",
           "grid_for", "draw_noise", "add_noise", "discrete_gaussian"]

#: c: a release's grid is c·Δ/√d (Δ its L2 sensitivity, d its dimension), so rounding to it adds c·Δ to Δ.
GRID_FRACTION = 2.0**-30

#: The two samplers a fit can use.
SAMPLERS = ("secure", "seeded")


class SecureGenerator(np.random.Generator):
    """The generator of a fit with ``seed=None``: privacy noise from the exact discrete Gaussian sampler on the
    operating system's secure source (:func:`gaussian_noise`); its numpy stream (seeded from the operating system)
    serves the fit's other randomness. Its children (``spawn``) are secure generators too."""

    sampler = "secure"

    def __init__(self, bit_generator: np.random.BitGenerator | None = None) -> None:
        super().__init__(np.random.PCG64(np.random.SeedSequence()) if bit_generator is None else bit_generator)


def sampler_of(rng: np.random.Generator) -> str:
    """``"secure"`` for a :class:`SecureGenerator`, ``"seeded"`` for any other numpy generator."""
    return "secure" if isinstance(rng, SecureGenerator) else "seeded"


@dataclass(frozen=True)
class Calibration:
    """One release's noise as drawn: its accounted L2 sensitivity, the noise standard deviation per coordinate
    and the grid (None: numpy's continuous sampler). ``sensitivity²/(2·sigma²)`` is what it spends."""

    sensitivity: float
    sigma: float
    grid: float | None


def calibrate(rng: np.random.Generator, *, sensitivity: float, sigma: float, dim: int) -> Calibration:
    """The release's calibration on ``rng``'s sampler: unchanged for a seeded generator. On the secure sampler the
    grid γ is the power of two at or below c·Δ/√d, and sensitivity and σ are both times 1 + γ√d/Δ (at most 1 + c):
    the rounded query's sensitivity is Δ + γ√d, and the release spends the same ρ (see the module docstring). A
    power of two keeps q/γ and (m + Z)·γ exact in floating point. A release without noise (σ = 0) or without a
    finite sensitivity gets no grid."""
    if sampler_of(rng) == "seeded" or not sigma > 0 or not math.isfinite(sensitivity) or not math.isfinite(sigma):
        return Calibration(sensitivity, sigma, None)
    grid, accounted = grid_for(sensitivity, dim)
    return Calibration(accounted, sigma * (accounted / sensitivity), grid)


def grid_for(sensitivity: float, dim: int) -> tuple[float, float]:
    """The secure sampler's grid γ for a release of L2 sensitivity Δ (finite, > 0) and dimension d, the power of two
    at or below c·Δ/√d, and the rounded query's sensitivity Δ′ ≥ Δ + γ√d (4 ulps up, however the three roundings
    go, so that the recorded ρ is never below the true one)."""
    target = GRID_FRACTION * sensitivity / math.sqrt(dim)
    if not target > 0:
        raise ValueError(f"a release's sensitivity ({sensitivity!r}) is too small for the secure sampler's grid; "
                         "rescale the data (bounds, thresholds) or pass a seed (numpy's sampler).")
    grid = math.ldexp(0.5, math.frexp(target)[1])  # the power of two at or below the target, exactly
    return grid, (sensitivity + grid * math.sqrt(dim)) * (1.0 + 2.0**-51)


def draw_noise(rng: np.random.Generator, sigma: np.ndarray | float, grid: np.ndarray | float | None = None,
               shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Noise of standard deviation ``sigma`` (per entry, broadcast to ``shape``), to be added by
    :func:`add_noise`. On a seeded generator ``rng.standard_normal(shape)·σ`` (bit for bit what numpy draws); on
    the secure one exact discrete Gaussian integers Z of standard deviation σ/γ in units of the entry's ``grid``
    γ (from :func:`calibrate`; an object array of Python ints, 0 where σ or γ is 0). The draws do not depend on
    the data."""
    sigma = np.asarray(sigma, dtype=np.float64)
    shape = sigma.shape if shape is None else tuple(shape)
    if grid is None:
        if sampler_of(rng) == "secure" and np.any(sigma > 0):
            raise ValueError("the secure sampler needs each release's grid (dpivreg.privacy.sampler.calibrate)")
        return rng.standard_normal(shape) * sigma
    sigmas = np.broadcast_to(sigma, shape).ravel().tolist()
    grids = np.broadcast_to(np.asarray(grid, dtype=np.float64), shape).ravel().tolist()
    draws = [discrete_gaussian(s / g) if s > 0 and g > 0 else 0 for s, g in zip(sigmas, grids)]
    out = np.empty(len(draws), dtype=object)
    out[:] = draws
    return out.reshape(shape)


def add_noise(query: np.ndarray, noise: np.ndarray, grid: np.ndarray | float | None = None) -> np.ndarray:
    """The release: ``query + noise`` for numpy's noise; on the secure sampler (a ``grid``) (m + Z)·γ, with
    m = round(q/γ) the query on the grid and Z the integer noise, summed as integers, so that the released float
    is a function of m + Z alone (one rounding, of that integer). Entries with grid 0 (no noise) are the query."""
    if grid is None:
        return query + noise
    query = np.asarray(query, dtype=np.float64)
    grids = np.broadcast_to(np.asarray(grid, dtype=np.float64), query.shape).ravel().tolist()
    noises = np.broadcast_to(np.asarray(noise, dtype=object), query.shape).ravel().tolist()
    out = query.ravel().tolist()
    for i, (q, g, z) in enumerate(zip(out, grids, noises)):
        if g > 0 and math.isfinite(q):
            units = q / g
            if abs(units) < 2.0**1000:  # round(q/γ) + Z as integers (Python's round: to nearest, ties to even)
                out[i] = float(round(units) + int(z)) * g
            else:  # q/γ beyond floats: the same rounding and sum in exact rationals
                out[i] = float((round(Fraction(q) / Fraction(g)) + int(z)) * Fraction(g))
    return np.array(out, dtype=np.float64).reshape(query.shape)


def make_rng(seed) -> np.random.Generator:
    """The generator of a fit from ``seed``: None (the default), a :class:`SecureGenerator` (privacy noise from the
    secure sampler); an int >= 0, a ``SeedSequence`` or a numpy ``Generator``, that seeded numpy generator."""
    if seed is None:
        return SecureGenerator()
    if isinstance(seed, np.random.SeedSequence):
        return np.random.default_rng(seed)
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}.")
        return np.random.default_rng(int(seed))
    raise TypeError(
        f"seed must be None, a non-negative int, a numpy.random.SeedSequence or a numpy.random.Generator, "
        f"got {type(seed).__name__}."
    )


# ---------------------------------------------------------------- the exact sampler (Canonne, Kamath & Steinke 2020)
class _SecureBits:
    """Uniform integers from the operating system's cryptographically secure source (``os.urandom``, as
    :mod:`secrets` uses), read 16 KiB at a time as 64-bit words: one system call per 2,048 words instead of one per
    draw, and no slicing of bytes per draw."""

    __slots__ = ("_words",)

    WORDS = 1 << 11

    def __init__(self) -> None:
        self._words: list[int] = []

    def _word(self) -> int:
        """A uniform 64-bit integer."""
        if not self._words:
            self._words = np.frombuffer(os.urandom(8 * self.WORDS), dtype=np.uint64).tolist()
        return self._words.pop()

    def below(self, n: int) -> int:
        """Uniform on {0, …, n − 1} (n ≥ 1), exactly: whole 64-bit words, concatenated to cover n − 1, masked to
        its bit length and redrawn while ≥ n (each try succeeds with probability above 1/2)."""
        if n == 1:
            return 0
        bits = (n - 1).bit_length()  # the fewest bits that cover 0 … n − 1
        mask = (1 << bits) - 1
        if bits <= 64:
            while True:
                value = self._word() & mask
                if value < n:
                    return value
        while True:
            value = 0
            for _ in range((bits + 63) >> 6):
                value = (value << 64) | self._word()
            value &= mask
            if value < n:
                return value


_THREAD = threading.local()  # one block of randomness per thread: threads never share a position


def _forget_after_fork() -> None:
    """A forked child must not reuse its parent's unread random bytes (they would repeat the parent's noise)."""
    _THREAD.__dict__.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _thread_below() -> Callable[[int], int]:
    """This thread's secure uniform sampler ``below(n)`` on {0, …, n − 1}, from its own block of system randomness
    (looked up once per draw of :func:`discrete_gaussian`, not once per uniform)."""
    try:
        return _THREAD.bits.below
    except AttributeError:
        _THREAD.bits = _SecureBits()
        return _THREAD.bits.below


def _bernoulli_exp_at_most_one(num: int, den: int, below: Callable[[int], int]) -> bool:
    """A draw of Bernoulli(exp(−num/den)) for 0 ≤ num ≤ den (Algorithm 1: K ← the first k whose Bernoulli(γ/k)
    fails; exp(−γ) is the probability that K is odd)."""
    k = 1
    while num >= den * k or below(den * k) < num:  # a Bernoulli of probability 1 needs no draw
        k += 1
    return k % 2 == 1


def _bernoulli_exp(num: int, den: int, below: Callable[[int], int]) -> bool:
    """A draw of Bernoulli(exp(−num/den)) for num/den ≥ 0: exp(−1) once per whole unit, then the remainder."""
    while num > den:
        if not _bernoulli_exp_at_most_one(1, 1, below):
            return False
        num -= den
    return _bernoulli_exp_at_most_one(num, den, below)


def _discrete_laplace(t: int, below: Callable[[int], int]) -> int:
    """A draw of the discrete Laplace distribution with scale t (P(x) ∝ exp(−abs(x)/t); Algorithm 2 with s = 1)."""
    while True:
        u = below(t)
        if not _bernoulli_exp_at_most_one(u, t, below):
            continue
        v = 0
        while _bernoulli_exp_at_most_one(1, 1, below):
            v += 1
        x = u + t * v
        negative = below(2)
        if negative and x == 0:
            continue
        return -x if negative else x


def discrete_gaussian(sigma: float) -> int:
    """An exact draw of the discrete Gaussian on the integers with parameter σ (P(x) ∝ exp(−x²/(2σ²))), from the
    operating system's secure source (Algorithm 3: discrete Laplace proposals of scale t = ⌊σ⌋ + 1, accepted with
    probability exp(−(abs(y) − σ²/t)²/(2σ²))). σ is taken as the exact rational value of the float."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be positive and finite, got {sigma!r}")
    a, b = _variance(sigma)  # σ² = a/b
    t = math.isqrt(a // b) + 1
    below = _thread_below()
    while True:
        y = _discrete_laplace(t, below)
        # (|y| − σ²/t)² / (2σ²) = (|y|·t·b − a)² / (2·a·t²·b)
        if _bernoulli_exp((abs(y) * t * b - a) ** 2, 2 * a * t * t * b, below):
            return y


@functools.lru_cache(maxsize=256)
def _variance(sigma: float) -> tuple[int, int]:
    """σ² as an exact fraction (numerator, denominator) of the float σ."""
    variance = Fraction(sigma) ** 2
    return variance.numerator, variance.denominator
