"""The noise sampler (issue 40, item 4; :mod:`dpivreg.privacy.sampler`): exact discrete Gaussian noise on a public
grid from the operating system's secure source by default, numpy's generator when a seed is given, and the
accounting of the grid (the rounded query's sensitivity Δ + γ√d, the noise σ·(Δ + γ√d)/Δ: the same ρ).

The secure sampler is not seedable, so its statistical tests use thresholds whose false-alarm probability is
stated (below 1e-6 each); everything else is exact.
"""

from __future__ import annotations

import math
import os
import re
import warnings

import numpy as np
import pytest
from scipy import stats

import dpivreg.privacy.sampler as sampler
from dpivreg import DPIV2SLS
from dpivreg.datasets import LABSUP_BOUNDS, load_labsup
from dpivreg.privacy.accounting import gaussian_zcdp
from dpivreg.privacy.mechanisms import release_histogram_counts, release_moment_sum
from dpivreg.privacy.sampler import (
    GRID_FRACTION,
    SecureGenerator,
    add_noise,
    calibrate,
    discrete_gaussian,
    draw_noise,
    make_rng,
    sampler_of,
)

FORMULA = "weeks ~ 1 + [kids ~ samesex]"
BOUNDS = {k: v for k, v in LABSUP_BOUNDS.items() if k in ("weeks", "kids", "samesex")}


@pytest.mark.parametrize("sigma", [0.6, 2.5, 9.0])
def test_the_discrete_gaussian_has_its_exact_distribution(sigma):
    """20,000 draws against the exact pmf P(x) ∝ exp(−x²/(2σ²)), a chi-square test over the cells with at least 5
    expected draws: the test fails a correct sampler with probability 1e-6."""
    draws = np.array([discrete_gaussian(sigma) for _ in range(20_000)])
    support = np.arange(-int(12 * sigma) - 2, int(12 * sigma) + 3)
    pmf = np.exp(-support.astype(float) ** 2 / (2 * sigma**2))
    pmf /= pmf.sum()
    expected = draws.size * pmf
    observed = np.array([(draws == k).sum() for k in support])
    cells = expected >= 5  # the rest pooled into one tail cell
    observed = np.append(observed[cells], observed[~cells].sum() + np.sum(np.abs(draws) > support[-1]))
    expected = np.append(expected[cells], draws.size - expected[cells].sum())
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert stats.chi2.sf(chi2, observed.size - 1) > 1e-6


def test_large_parameters_have_the_continuous_spread():
    """At the grids' scale (σ/γ ≈ 2³⁰ and beyond) the draws' standard deviation is σ: 2,000 draws, 6 standard
    errors of a standard deviation estimate (≈ σ/√(2·2000))."""
    for sigma in (3.1e9, 4.7e13):
        draws = np.array([discrete_gaussian(sigma) for _ in range(2000)], dtype=float)
        assert abs(draws.std() / sigma - 1) < 6 / math.sqrt(4000)
        assert all(isinstance(discrete_gaussian(sigma), int) for _ in range(5))


def test_calibration_exact_values():
    """Grid γ = the power of two at or below 2⁻³⁰·Δ/√d; sensitivity and σ both times 1 + γ√d/Δ; the same ρ. A
    seeded generator, no noise or no finite sensitivity: unchanged, no grid."""
    secure = SecureGenerator()
    delta, sigma, d = 0.37, 1.3, 10
    cal = calibrate(secure, sensitivity=delta, sigma=sigma, dim=d)
    assert cal.grid == 2.0 ** math.floor(math.log2(GRID_FRACTION * delta / math.sqrt(d)))
    assert GRID_FRACTION * delta / math.sqrt(d) / 2 < cal.grid <= GRID_FRACTION * delta / math.sqrt(d)
    exact = delta + cal.grid * math.sqrt(d)  # the rounded query's sensitivity; recorded at most 4 ulps above it
    assert exact <= cal.sensitivity <= exact * (1 + 2.0**-50)
    assert cal.sigma == sigma * (cal.sensitivity / delta)
    assert gaussian_zcdp(cal.sensitivity, cal.sigma, 1) == pytest.approx(gaussian_zcdp(delta, sigma, 1), rel=1e-15)
    edge = calibrate(secure, sensitivity=math.nextafter(1.0, 0.0), sigma=1.0, dim=1)  # log2 would round up here
    assert edge.grid <= GRID_FRACTION * math.nextafter(1.0, 0.0)
    assert calibrate(np.random.default_rng(0), sensitivity=delta, sigma=sigma, dim=d) == sampler.Calibration(
        delta, sigma, None)
    assert calibrate(secure, sensitivity=delta, sigma=0.0, dim=d).grid is None
    assert calibrate(secure, sensitivity=math.inf, sigma=sigma, dim=d).grid is None


def test_rounding_to_the_grid_moves_neighbours_apart_by_at_most_the_accounted_sensitivity():
    """The rounded queries of two neighbours differ by at most Δ + γ√d in L2 norm, in whole grid units: worst
    cases put each coordinate just on either side of a half-grid point."""
    rng = np.random.default_rng(5)
    secure = SecureGenerator()
    for d in (1, 3, 40):
        delta = 0.5
        cal = calibrate(secure, sensitivity=delta, sigma=1.0, dim=d)
        gamma = cal.grid
        direction = rng.normal(size=d)
        direction /= np.linalg.norm(direction)
        base = (rng.integers(-1000, 1000, size=d) + 0.5) * gamma - 1e-3 * gamma * np.sign(direction)
        q1, q2 = base, base + delta * direction
        zero = np.zeros(d, dtype=object)
        r1, r2 = add_noise(q1, zero, gamma), add_noise(q2, zero, gamma)
        assert np.allclose((r1 / gamma) % 1, 0) and np.allclose((r2 / gamma) % 1, 0)
        assert np.linalg.norm(r1 - r2) <= cal.sensitivity * (1 + 1e-12)


def test_a_secure_release_is_a_function_of_the_integer_sum_on_the_grid():
    """(m + Z)·γ: every released entry is a whole number of grid units, and pairs (m, Z) with the same sum release
    the same float."""
    gamma = 2.0**-40
    query = np.array([3 * gamma, 1e6 * gamma + 0.2 * gamma, 0.5])
    out = add_noise(query, np.array([7, -2, 11], dtype=object), gamma)
    assert out[0] == 10 * gamma and out[1] == (1_000_000 - 2) * gamma
    assert float(out[2] / gamma).is_integer()
    assert add_noise(np.array([5 * gamma]), np.array([3], dtype=object), gamma)[0] == add_noise(
        np.array([6 * gamma]), np.array([2], dtype=object), gamma)[0]
    assert add_noise(np.array([np.inf, 2.0]), np.array([4, 4], dtype=object), np.array([gamma, 0.0])).tolist() == [
        np.inf, 2.0]  # not finite: unchanged; grid 0: no noise


def test_mechanisms_release_on_their_grid_and_record_it():
    """The moment and histogram releases on the secure sampler: released entries on the recorded grid, the
    record's sensitivity and σ inflated alike, the ρ asked for; on a seeded generator numpy's draws, no grid."""
    secure = SecureGenerator()
    outer = np.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]])
    M, record, sigma = release_moment_sum(outer, 10, rho=0.5, rng=secure, sensitivity=0.3, bound=1.0, name="m")
    assert record.grid is not None and np.allclose(M, M.T, rtol=0, atol=0)
    assert np.all(np.mod(M[np.triu_indices(3)] / record.grid, 1) == 0)
    assert record.rho == pytest.approx(0.5, rel=1e-12) and record.sensitivity > 0.3 and sigma == record.noise_std
    counts = np.array([[3.0, 0.0, 5.0], [1.0, 1.0, 6.0]])
    noisy, record, _ = release_histogram_counts(counts, rho=0.2, rng=secure, name="h", stage="rho_clip")
    assert np.all(np.mod(noisy / record.grid, 1) == 0) and record.rho == pytest.approx(0.2, rel=1e-12)
    seeded_M, seeded, _ = release_moment_sum(outer, 10, rho=0.5, rng=np.random.default_rng(1), sensitivity=0.3,
                                             bound=1.0, name="m")
    upper = np.triu(np.random.default_rng(1).standard_normal((3, 3)) * seeded.noise_std)
    np.testing.assert_array_equal(seeded_M, outer / 10 + upper + np.triu(upper, 1).T)
    assert seeded.grid is None


def test_draws_need_a_grid_on_the_secure_generator():
    with pytest.raises(ValueError, match="grid"):
        draw_noise(SecureGenerator(), 1.0, None, (2,))
    assert draw_noise(SecureGenerator(), np.array([0.0, 1.0]), np.array([0.0, 0.25])).tolist()[0] == 0


def test_seed_none_is_the_secure_sampler_and_a_seed_is_numpy():
    assert sampler_of(make_rng(None)) == "secure" and sampler_of(make_rng(None).spawn(1)[0]) == "secure"
    assert sampler_of(make_rng(3)) == "seeded" and sampler_of(make_rng(np.random.SeedSequence(3))) == "seeded"
    g = np.random.default_rng(1)
    assert make_rng(g) is g


@pytest.fixture(scope="module")
def model():
    return DPIV2SLS.from_formula(FORMULA, load_labsup())


def _count_draws(monkeypatch) -> list:
    draws = []
    real = sampler.discrete_gaussian

    def counted(sigma):
        draws.append(sigma)
        return real(sigma)

    monkeypatch.setattr(sampler, "discrete_gaussian", counted)
    return draws


@pytest.mark.parametrize("options", [{}, {"method": "moments"}, {"cov_type": "unadjusted"},
                                     {"rho_diag": 0.2, "rho": 2.8}], ids=["default", "moments", "unadjusted", "diag"])
def test_a_default_fit_draws_every_release_from_the_secure_sampler(model, monkeypatch, options):
    """seed=None: every noisy release is on its grid (res.privacy.sampler == "secure"), each record's noise was
    drawn by the exact sampler at that record's σ/γ, and the sampler drew for nothing else. A release that fell
    back to numpy's generator has no matching draws (or no grid): this test fails on such a variant. Two fits
    differ; the summary and the release record say "secure"."""
    draws = _count_draws(monkeypatch)
    kwargs = {"rho": 2.6, "bounds": BOUNDS, **options}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = model.fit(**kwargs)
    noisy = [r for r in res.privacy.releases if r.noise_std > 0]
    assert res.privacy.sampler == "secure" and all(r.grid is not None for r in noisy)
    assert {r.noise_std / r.grid for r in noisy} == set(draws)
    assert len(draws) >= sum(r.steps for r in noisy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = model.fit(**kwargs)
    assert not np.array_equal(res.params.to_numpy(), again.params.to_numpy())
    assert re.search(r"Noise sampler: +secure", res.summary().as_text())
    assert '"sampler": "secure"' in res.release().to_json()
    assert res.privacy.rho == pytest.approx(kwargs["rho"], rel=1e-12)


def test_a_seeded_fit_says_so_and_is_reproducible(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = model.fit(rho=2.6, bounds=BOUNDS, seed=4), model.fit(rho=2.6, bounds=BOUNDS, seed=4)
    assert a.privacy.sampler == "seeded" and all(r.grid is None for r in a.privacy.releases)
    np.testing.assert_array_equal(a.params, b.params)
    text = a.summary().as_text()
    assert re.search(r"Noise sampler: +seeded", text) and "Seeded noise" in text
    assert '"sampler": "seeded"' in a.release().to_json()


def test_the_release_record_keeps_the_grids(model):
    from dpivreg import FitRelease

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record = model.fit(rho=2.6, bounds=BOUNDS).release()
        loaded = FitRelease.from_json(record.to_json())
    assert [r.grid for r in loaded.privacy.releases] == [r.grid for r in record.privacy.releases]
    assert loaded.privacy.sampler == "secure"


def test_dp_2s_gd_on_arrays_uses_the_secure_sampler_by_default():
    from dpivreg import dp_2s_gd

    rng = np.random.default_rng(0)
    Z = rng.normal(size=(400, 2))
    X = Z @ np.array([[1.0], [0.5]]) + rng.normal(size=(400, 1))
    Y = X[:, 0] + rng.normal(size=400)
    path = dp_2s_gd(Z, X, Y, T=3, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.5, clip1=3.0, clip2=3.0)
    assert path.privacy.sampler == "secure" and path.privacy.rho == pytest.approx(2.0, rel=1e-12)
    seeded = dp_2s_gd(Z, X, Y, T=3, rho1=1.0, rho2=1.0, eta=0.5, alpha=0.5, clip1=3.0, clip2=3.0, seed=1)
    assert seeded.privacy.sampler == "seeded"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_does_not_repeat_its_parents_noise():
    """The sampler reads system randomness in blocks; a child forked after a draw (multiprocessing's fork, a
    process scheduler) must not reuse the parent's unread bytes: it would draw the parent's noise again."""
    discrete_gaussian(1e9)  # this thread's block is filled
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, repr([discrete_gaussian(1e9) for _ in range(5)]).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1 << 16).decode()
    os.waitpid(pid, 0)
    assert repr([discrete_gaussian(1e9) for _ in range(5)]) != child


@pytest.mark.parametrize("n", [2, 3, 1000, 2**64 + 3])
def test_secure_uniforms_are_uniform_on_their_range(n):
    """below(n) is uniform on {0, …, n − 1} for one-word and multi-word n: the draws stay in range and k = min(n, 4)
    equal slices of the range are equally likely (chi-square, false alarm 1e-6; the slices of 2⁶⁴ + 3 differ in
    size by at most one value in 2⁶²)."""
    bits = sampler._SecureBits()
    draws = [bits.below(n) for _ in range(20000)]
    assert min(draws) >= 0 and max(draws) < n
    k = min(n, 4)
    slices = np.bincount([k * d // n for d in draws], minlength=k)
    assert stats.chisquare(slices).pvalue > 1e-6


def test_secure_uniforms_come_from_the_system_source(monkeypatch):
    """The words are the operating system's bytes, read as little-endian 64-bit words (a variant that drew from
    numpy's generator, or read fewer bits than n needs, gives other values)."""
    block = bytes(range(256)) * (8 * sampler._SecureBits.WORDS // 256)
    calls = []
    monkeypatch.setattr(sampler.os, "urandom", lambda size: calls.append(size) or block[:size])
    bits = sampler._SecureBits()
    words = np.frombuffer(block, dtype=np.uint64).tolist()
    assert bits.below(2**64) == words[-1]  # all 64 bits, the last word first
    assert bits.below(2**65) == ((words[-2] << 64) | words[-3]) & (2**65 - 1)  # two words, 65 bits, no rejection
    assert calls == [8 * sampler._SecureBits.WORDS]
