"""The Gaussian mechanisms dpivreg releases besides the gradient steps, each with its sensitivity and proof.

Neighbouring data sets replace one row; n is public. A Gaussian mechanism with L2 sensitivity Δ and
noise standard deviation σ per coordinate is Δ²/(2σ²)-zCDP (Bun & Steinke 2016, Prop. 1.6). Each
function here returns what it released, its :class:`~dpivreg.privacy.accounting.Release` record and σ; the data
part of each release is a sum over rows (``*_sum``), so it can be accumulated block by block (in
memory or on Dask) and noised once at the driver.

Second moments of rows in a box (:func:`box_second_moments`)
    Rows v ∈ {1}ᶜ × [−1, 1]ᵈ (c = 1 when a constant leads), D = c + d coordinates. The release is
    the upper triangle (diagonal included) of VᵀV/n plus i.i.d. N(0, σ²), mirrored. Its
    replace-one sensitivity is **D/n** (tight when D is even):

    For rows a, b write s = (a + b)/2, t = (a − b)/2, so that abs(sᵢ) + abs(tᵢ) ≤ 1 and
    aᵢaⱼ − bᵢbⱼ = 2(sᵢtⱼ + tᵢsⱼ). The squared norm of the upper triangle of aaᵀ − bbᵀ is
    Σ_{i<j} 4(sᵢtⱼ + tᵢsⱼ)² + Σᵢ 16sᵢ²tᵢ² = 4[‖s‖²‖t‖² + (sᵀt)² + 2Σᵢsᵢ²tᵢ²]. With
    c = Σᵢ abs(sᵢtᵢ) ≤ D/4: (sᵀt)² ≤ c², Σᵢsᵢ²tᵢ² ≤ c/4 and ‖s‖² + ‖t‖² = Σᵢ(abs(sᵢ) + abs(tᵢ))² − 2c ≤ D − 2c,
    so ‖s‖²‖t‖² ≤ (D − 2c)²/4. Altogether the bracket is at most
    D²/4 − c(D − 2c − 1/2) ≤ D²/4, since D − 2c − 1/2 ≥ D/2 − 1/2 ≥ 0. Hence the norm is at most D.
    It is attained for even D by a = (1, …, 1) and b = a with D/2 non-constant coordinates
    negated; for odd D the largest value found numerically is √(D² − 1). The release clips every
    entry to [−1, 1] itself, so the bound holds whatever it is given. (A row bounded only in L2
    norm by B = √D would have sensitivity √2·D/n, see :func:`ball_second_moments`; the box is
    √2 tighter.)

Second moments of norm-bounded rows (:func:`ball_second_moments`, "Analyze Gauss")
    Rows clipped to L2 norm B; sensitivity √2·B²/n (‖wwᵀ − w′w′ᵀ‖²_F = ‖w‖⁴ + ‖w′‖⁴ − 2(wᵀw′)² ≤ 2B⁴;
    the upper triangle has at most that norm, attained by w = Be₁, w′ = Be₂).

Floating point (:mod:`dpivreg.privacy.rounding`)
    The sums are taken in blocks of at most 2¹⁶ rows whose products are added pairwise
    (:func:`~dpivreg.privacy.rounding.blocked_gram`), whatever the number of rows, and the moment releases'
    sensitivities and noise are multiplied by the rounding allowance of that order of summation
    (:func:`~dpivreg.privacy.rounding.box_rounding`, :func:`~dpivreg.privacy.rounding.ball_rounding`; the release
    records it), so that they hold for the sums as computed. Histogram counts are integers below 2⁵³, exact in
    float64: no allowance.

Histograms (:func:`histograms`)
    G histograms over public bins, each row counted once in each. Replacing a row moves at most one
    count from one bin to another in each histogram: sensitivity √(2G). Used to choose clipping
    thresholds privately (:func:`clip_from_histogram`, post-processing), from the bins seen above the noise
    (:func:`seen_bins`: bins above 3σ, a lone one away from well-resolved data only above the histogram's Bonferroni
    level).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from dpivreg._validation import check_raw_clip
from dpivreg.privacy.accounting import Release, gaussian_zcdp
from dpivreg.privacy.rounding import EXACT_COUNT_LIMIT, ball_rounding, blocked_gram, box_rounding
from dpivreg.privacy.sampler import Calibration, add_noise, calibrate, draw_noise

__all__ = [
    "box_moment_sum",
    "box_moment_sensitivity",
    "box_second_moments",
    "release_moment_sum",
    "ball_moment_sum",
    "ball_second_moments",
    "unit_rows",
    "max_scaled_rows",
    "log_grid",
    "histogram_counts",
    "histograms",
    "release_histogram_counts",
    "SEEN_BIN_SIGMAS",
    "RESOLVED_PEAK_SIGMAS",
    "isolated_bin_sigmas",
    "seen_bins",
    "clip_from_histogram",
]


# ----------------------------------------------------------------------------------------
# second moments
# ----------------------------------------------------------------------------------------
def box_moment_sum(V: np.ndarray, has_constant: bool) -> np.ndarray:
    """Σᵢ vᵢvᵢᵀ of the rows of [1, V] (or V), every entry of V clipped to [−1, 1] first (NaN to −1: the clamp is
    total, so one row moves the sum by at most the stated sensitivity whatever it holds)."""
    V = np.fmin(np.fmax(V, -1.0), 1.0)  # fmax returns −1 for NaN, where np.clip would keep the NaN
    if has_constant:
        V = np.column_stack([np.ones(V.shape[0]), V])
    return blocked_gram(V)


def box_moment_sensitivity(dim: int, n: int) -> float:
    """Replace-one L2 sensitivity D/n of the upper triangle of VᵀV/n for rows in a box of D coordinates
    (the constant included), see the module docstring."""
    return dim / n


def box_second_moments(V: np.ndarray, *, rho: float, rng: np.random.Generator, has_constant: bool,
                       name: str = "second moments (rows in a box)",
                       stage: str = "rho0") -> tuple[np.ndarray, Release, float]:
    """Release [1, V]ᵀ[1, V]/n (or VᵀV/n) with symmetric Gaussian noise, spending ``rho`` zCDP.

    Parameters
    ----------
    V : ndarray (n, d)
        The rows; every entry is clipped to [−1, 1] (a no-op for columns mapped there by public bounds).
    rho : float
        zCDP budget; ``inf`` releases the exact matrix (not private).
    rng : numpy.random.Generator
        Source of the noise.
    has_constant : bool
        Prepend a constant column of ones (its own second moment, 1, is released too, with noise).

    Returns
    -------
    M : ndarray (D, D)
        The released symmetric matrix, D = d + has_constant.
    release : Release
        Its record: sensitivity D/n times the rounding allowance of the blocked sum
        (:func:`dpivreg.privacy.rounding.box_rounding`; 1 + 1.19·10⁻³ at n = 10⁸ and D = 3).
    sigma : float
        The noise standard deviation of each entry.
    """
    n = V.shape[0]
    dim = V.shape[1] + bool(has_constant)
    return release_moment_sum(box_moment_sum(V, has_constant), n, rho=rho, rng=rng,
                              sensitivity=box_moment_sensitivity(dim, n), bound=1.0, name=name, stage=stage,
                              rounding=box_rounding(n, dim))


def release_moment_sum(outer_sum: np.ndarray, n: int, *, rho: float, rng: np.random.Generator, sensitivity: float,
                       bound: float, name: str, stage: str = "rho0",
                       rounding: float = 1.0) -> tuple[np.ndarray, Release, float]:
    """Add symmetric Gaussian noise calibrated to ``sensitivity`` to outer_sum/n (upper triangle i.i.d.,
    mirrored). ``bound`` is recorded as the release's clipping bound. ``rounding``: the floating-point allowance of
    the sum as computed (:mod:`dpivreg.privacy.rounding`), which multiplies the sensitivity and the noise (the same ρ)
    and is recorded; the secure sampler's grid is then made for that sensitivity."""
    d = outer_sum.shape[0]
    sensitivity = rounding * sensitivity
    sigma = 0.0 if math.isinf(rho) else sensitivity / math.sqrt(2.0 * rho)
    cal = calibrate(rng, sensitivity=sensitivity, sigma=sigma, dim=d * (d + 1) // 2)
    if cal.grid is None:
        upper = np.triu(rng.standard_normal((d, d)) * sigma)
        M = outer_sum / n + upper + np.triu(upper, 1).T
    else:  # the released entries only (the upper triangle), on the grid; the lower triangle mirrors them
        rows, cols = np.triu_indices(d)
        M = np.zeros((d, d))
        M[rows, cols] = add_noise((outer_sum / n)[rows, cols], draw_noise(rng, cal.sigma, cal.grid, rows.shape),
                                  cal.grid)
        M = M + np.triu(M, 1).T
    return M, _record(name, stage, bound, cal, rounding), cal.sigma


def _record(name: str, stage: str, bound: float | None, cal: Calibration, rounding: float = 1.0) -> Release:
    """The record of one Gaussian release as drawn (:func:`dpivreg.privacy.sampler.calibrate`), with its rounding
    allowance (:mod:`dpivreg.privacy.rounding`)."""
    return Release(name, stage, 1, bound, cal.sensitivity, cal.sigma, gaussian_zcdp(cal.sensitivity, cal.sigma, 1),
                   cal.grid, rounding)


def ball_moment_sum(W: np.ndarray, row_bound: float) -> np.ndarray:
    """Σᵢ wᵢwᵢᵀ over the rows of W, each clipped to L2 norm ``row_bound`` = B: a longer row adds B²·uᵢuᵢᵀ with its
    unit vector uᵢ (:func:`unit_rows`, exact for rows of any finite size), a row with an infinite or NaN value adds
    nothing (it has no direction; nothing is a row of norm ≤ B)."""
    largest, unit, scaled_norms = unit_rows(W)
    finite = np.isfinite(largest)
    with np.errstate(over="ignore", invalid="ignore"):
        over = finite & (largest * scaled_norms > row_bound)
    kept, clipped = W[finite & ~over], unit[over]
    return blocked_gram(kept) + row_bound**2 * blocked_gram(clipped)


def unit_rows(A: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row aᵢ as (max|aᵢⱼ|, aᵢ/‖aᵢ‖, ‖aᵢ/max|aᵢⱼ|‖ in [1, √k]).

    ‖aᵢ‖ is the product of the first and the last, without the overflow (values over 1e154) or the underflow (values
    under 1e-154) of √(Σaᵢⱼ²); the unit vector is formed from the scaled row, since dividing by a subnormal ‖aᵢ‖
    would not give norm 1. Zero rows and rows with an infinite or NaN value have unit vector 0 (their largest value,
    0 or inf / NaN, tells which). The clipping primitive of every release that must hold for rows of any size.
    """
    largest, scaled = max_scaled_rows(A)
    norms = np.sqrt(np.einsum("ij,ij->i", scaled, scaled))
    norms[norms == 0] = 1.0  # the rows of zeros left by max_scaled_rows
    return largest, scaled / norms[:, None], norms


def max_scaled_rows(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row aᵢ as (max|aᵢⱼ|, aᵢ/max|aᵢⱼ|): the scaled row's largest value is ±1, so its squares neither overflow
    nor all underflow. Zero rows and rows with an infinite or NaN value scale to 0."""
    largest = np.max(np.abs(A), axis=1) if A.shape[1] else np.zeros(A.shape[0])
    usable = (largest > 0) & np.isfinite(largest)
    with np.errstate(invalid="ignore"):
        scaled = np.where(usable[:, None], A / np.where(usable, largest, 1.0)[:, None], 0.0)
    return largest, scaled


def ball_second_moments(W: np.ndarray, *, rho: float, rng: np.random.Generator, row_bound: float,
                        name: str = "second moments", stage: str = "rho0") -> tuple[np.ndarray, Release, float]:
    """Release WᵀW/n with rows clipped to L2 norm ``row_bound`` = B ("Analyze Gauss", Dwork, Talwar,
    Thakurta & Zhang 2014): sensitivity √2·B²/n (module docstring) times the rounding allowance of the blocked sum
    (:func:`dpivreg.privacy.rounding.ball_rounding`, 1 + 1.03·10⁻³ at n = 10⁸). ``rho = inf``: the exact matrix."""
    n = W.shape[0]
    row_bound = check_raw_clip(row_bound, "row_bound")
    return release_moment_sum(ball_moment_sum(W, row_bound), n, rho=rho, rng=rng,
                              sensitivity=math.sqrt(2.0) * row_bound**2 / n, bound=row_bound, name=name,
                              stage=stage, rounding=ball_rounding(n, W.shape[1]))


# ----------------------------------------------------------------------------------------
# histograms and clipping thresholds
# ----------------------------------------------------------------------------------------
def log_grid(reference: float, *, below: int = 8, above: int = 12) -> np.ndarray:
    """Public bin edges reference·2^(k/2), k = −2·below … 2·above (bins a factor √2 wide)."""
    return reference * np.sqrt(2.0) ** np.arange(-2 * below, 2 * above + 1)


def histogram_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of ``values`` in the bins [edges[k], edges[k+1]); values beyond either end go to the end bins."""
    bins = edges.shape[0] - 1
    index = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, bins - 1)
    return np.bincount(index, minlength=bins).astype(np.float64)


def release_histogram_counts(counts: np.ndarray, *, rho: float, rng: np.random.Generator,
                             name: str, stage: str, max_rows: int = 1) -> tuple[np.ndarray, Release, float]:
    """Gaussian noise on G histograms (rows of ``counts``) of the same rows: sensitivity √(2G); with ``max_rows``
    = m (a neighbour replaces up to m counted rows: a privacy unit's, :mod:`dpivreg.privacy.units`) m·√(2G), since
    moving at most m counts out of and m into each histogram changes it by at most √(m² + m²)."""
    groups = counts.shape[0]
    if not np.all(np.abs(counts) < EXACT_COUNT_LIMIT):  # counts below 2⁵³ are summed exactly: no rounding allowance
        raise ValueError("a histogram's counts must be below 2**53, where float64 counts them exactly.")
    sensitivity = max_rows * math.sqrt(2.0 * groups)
    sigma = 0.0 if math.isinf(rho) else sensitivity / math.sqrt(2.0 * rho)
    cal = calibrate(rng, sensitivity=sensitivity, sigma=sigma, dim=counts.size)
    noisy = add_noise(counts, draw_noise(rng, cal.sigma, cal.grid, counts.shape), cal.grid)
    return noisy, _record(name, stage, None, cal), cal.sigma


def histograms(values: list[np.ndarray], edges: list[np.ndarray], *, rho: float, rng: np.random.Generator,
               name: str = "histograms", stage: str = "rho_clip") -> tuple[np.ndarray, Release, float]:
    """Release one histogram per entry of ``values`` (each of the same n rows) over public ``edges``."""
    counts = np.array([histogram_counts(v, e) for v, e in zip(values, edges)])
    return release_histogram_counts(counts, rho=rho, rng=rng, name=name, stage=stage)


#: The lower level, in noise standard deviations, of the bins seen above a histogram's noise (:func:`seen_bins`):
#: noise alone passes it in 0.13% of bins.
SEEN_BIN_SIGMAS = 3.0
#: A histogram resolves its data when its largest noisy count exceeds this many noise standard deviations
#: (:func:`seen_bins`).
RESOLVED_PEAK_SIGMAS = 6.0


def isolated_bin_sigmas(threshold: float, bins: int) -> float:
    """z with P(N(0, 1) > z) = P(N(0, 1) > ``threshold``)/``bins``: a bin standing alone must pass z·σ, so that a
    histogram of ``bins`` empty bins shows one as rarely as a single bin passes ``threshold``·σ (Bonferroni;
    3.98 for 3σ and 40 bins)."""
    tail = 0.5 * math.erfc(threshold / math.sqrt(2.0)) / max(bins, 1)
    return max(threshold, -NormalDist().inv_cdf(tail))


def seen_bins(noisy_counts: np.ndarray, sigma: float, *, threshold: float = SEEN_BIN_SIGMAS) -> np.ndarray:
    """The bins of one released histogram (1-D) taken to hold rows (post-processing).

    Every bin whose noisy count exceeds ``threshold``·σ, unless the histogram resolves its data (its largest count
    above ``RESOLVED_PEAK_SIGMAS``·σ); then a run of adjacent such bins is seen when it is at least two bins long or
    holds a bin above :func:`isolated_bin_sigmas`·σ (as the largest count's run does), and a lone bin below that
    level is taken for noise. With σ = 0 every non-empty bin is seen.

    Why. Noise alone passes 3σ in 0.13% of bins: over a grid's 40 bins a 5% chance per histogram of a lone bin far
    above the data, which moved a threshold there (the effective F's first-stage meat at n = 10⁴: 1% of releases,
    C 2⁹–2¹³ instead of 23 and the statistic near 0; at n = 10³ the reading changed the estimate or standard error
    of 4.5–34% of fits).
    Rows fill adjacent bins around the largest count, so a lone bin away from them must pass the level at which the
    whole histogram shows a false one as rarely as one bin passes 3σ; two adjacent noise bins above 3σ come up in
    about 39·0.00135² = 0.007% of histograms, so runs keep 3σ, and a noise bin next to the data joins it as before.
    Where the largest count is within 6σ (n of a few hundred rows at ρ ≤ 2) the data's own bins hover near 3σ with
    gaps between them and cannot be told from noise: there the one level is kept (measured: reading lone bins as
    noise there raised the error of the paper's design at n = 300, ρ = 0.5 from 1.7 to 3.5 2SLS s.e. in the
    median; ``benchmarks/threshold_rule.py``).
    """
    counts = np.asarray(noisy_counts, dtype=np.float64)
    above = counts > threshold * sigma
    if not above.any() or counts.max() <= RESOLVED_PEAK_SIGMAS * sigma:
        return above
    strong = counts > isolated_bin_sigmas(threshold, counts.shape[0]) * sigma
    run = np.cumsum(~above)  # the bins of one run of adjacent ``above`` bins share a number
    kept = np.bincount(run, weights=above) >= 2
    kept[run[strong]] = True  # the largest count (above 6σ) is among the strong bins
    return above & kept[run]


def clip_from_histogram(noisy_counts: np.ndarray, edges: np.ndarray, *, target: float, sigma: float,
                        threshold: float = SEEN_BIN_SIGMAS) -> float:
    """A clipping threshold from a released histogram of per-row norms (post-processing).

    Bins not seen above the noise (:func:`seen_bins`) are treated as empty; the result is the smallest bin edge
    above which the remaining counts add up to at most ``target`` rows, i.e. a private (1 − target/n) quantile
    rounded up to the grid. When the tail is too thin to be seen above the noise this is the upper edge of the
    highest bin that is, so at small n (or a small budget) the threshold sits at the top of the visible data rather
    than in it. When no bin is seen it is the grid's top edge: a threshold that clips nothing (wide noise, which
    the standard errors and the choice of estimator then see) rather than the bottom edge, which would clip every
    row to almost nothing (measured on the paper's design at n = 200, ρ = 0.5: median error 12.2 2SLS s.e. with
    the bottom edge, 9.2 with the top; ``benchmarks/threshold_rule.py``).
    """
    seen = seen_bins(noisy_counts, sigma, threshold=threshold)
    if not seen.any():
        return float(edges[-1])
    kept = np.where(seen, noisy_counts, 0.0)
    above = np.cumsum(kept[::-1])[::-1]  # above[k]: rows in bins k, k+1, … (above edge k)
    ok = np.nonzero(above <= target)[0]
    return float(edges[ok[0]] if ok.size else edges[-1])
