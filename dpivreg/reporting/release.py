"""A fit's private releases as a record that can be saved, published and loaded: no row of data inside.

:meth:`DPIVResults.release() <dpivreg.reporting.results.DPIVResults.release>` gives a :class:`FitRelease`: the private
estimate, its standard errors, covariance and intervals, the released paths β⁽⁰…ᵀ⁾ and Θ⁽⁰…ᵀ⁾, the
accountant's list of releases (so the budget and ε at any δ can be re-derived), the public settings and
scaling (bounds), the design's names, the public row count and any privacy leaks the fit announced.

What it leaves out, because it is data or computed from data without noise: the design and its arrays,
the working arrays, the NON-PRIVATE 2SLS benchmark and the clipping counts. A column scale read from the data
(a column without bounds) and step sizes from the data's eigenvalues (the paper's rule) are leaks the fit
announced; the record names them ``"data (not recorded)"`` instead of copying them. ``scaling`` holds the
bounds' map of each column (centre and half-range); with ``preprocess="data"`` the centring and whitening that
followed came from the exact data moments, which the record does not hold (and whose release it lists with
ρ = ∞). A record is a release only when :attr:`FitRelease.is_private` is True.

Loading checks the record: a missing or malformed field, or a stored summary number (ρ, ε, standard errors,
intervals) that does not follow from the stored releases and covariance — an edited file —, is a ValueError.

The JSON is standard (``json.loads`` of any language reads it): floats are written with Python's ``repr``,
which round-trips doubles exactly, and the non-finite values a fit can hold (``inf`` for a non-private
stage, ``nan`` for an entry without an estimate) are written as the strings ``"inf"``, ``"-inf"`` and
``"nan"``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpivreg._validation import check_flag
from dpivreg.errors import PrivacyLeakWarning
from dpivreg.privacy.accounting import PrivacyBudget, Release
from dpivreg.privacy.units import UnitFacts
from dpivreg.reporting.summary import release_summary
from dpivreg.reporting.tables import (
    IV_TEST_COLUMNS,
    IV_TEST_NUMBERS,
    PrivateTable,
    SummaryAccessor,
    iv_test_frame,
    size_text,
)

__all__ = ["RELEASE_FORMAT", "FitRelease", "load_release"]

#: Identifier and version of the JSON layout (bumped when a field changes meaning).
RELEASE_FORMAT = "dpivreg.FitRelease/1"


def _encode(value: Any) -> Any:
    """A JSON-ready copy: arrays as nested lists, non-finite floats as strings."""
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, np.ndarray):
        return _encode(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else repr(value)
    return value


def _floats(values) -> np.ndarray:
    """The inverse of :func:`_encode` for an array of floats ("inf"/"nan" strings back to floats)."""
    return np.asarray(values, dtype=float)


@dataclass(frozen=True, eq=False)
class FitRelease(PrivateTable):
    """The private output of one fit, with its budget and public settings, and nothing of the data.

    Build it with :meth:`DPIVResults.release() <dpivreg.reporting.results.DPIVResults.release>`; save with
    :meth:`save` / :meth:`to_json`, load with :func:`load_release` / :meth:`from_json`.

    Attributes
    ----------
    dependent : str
        The dependent variable's name.
    formula : str or None
        The formula the model was built from (None for arrays).
    endog_names, instrument_names, exog_names : tuple of str
        The design's endogenous regressors, excluded instruments and exogenous regressors.
    nobs : int
        The row count (public), or with a privacy unit its released estimate (``unit``).
    estimator : str
        ``"DP-2S-GD"`` or ``"noisy moments"``.
    params : pandas.Series
        The private estimate, by regressor (exogenous first), original units.
    cov : pandas.DataFrame or None
        Its private covariance (None when the fit made no inference).
    cov_type : str
        ``"robust"``, ``"unadjusted"`` or ``"none"``.
    path : pandas.DataFrame
        β⁽⁰⁾ … β⁽ᵀ⁾ (rows) in original units.
    first_stage_path : numpy.ndarray
        Θ⁽⁰⁾ … Θ⁽ᵀ⁾, shape (T + 1, instruments incl. exogenous, endogenous), original units.
    privacy : PrivacyBudget
        The accountant's releases; ``privacy.rho`` is the total zCDP, ``privacy.epsilon(delta)`` ε.
    delta : float
        The δ the fit reported ε at.
    settings : dict
        The public tuning of the fit (T, step sizes, clipping thresholds, method, start, schedule, budgets
        asked for, calibration, τ, κ̂ and where each came from).
    scaling : dict
        Per design column, the public working scale: ``{"centre", "scale", "source"}`` (source ``"bounds"``
        or ``"constant"``; a data-derived scale is ``"data (not recorded)"``).
    leaks : tuple of str
        The fit's :class:`~dpivreg.PrivacyLeakWarning` messages (empty for a private fit).
    inference_note : str
        Why there are no standard errors, when there are none.
    version : str
        The dpivreg version that made the fit.
    created : str
        When the record was made (ISO 8601).
    unit : dict or None
        With a privacy unit or clusters, their public facts (:meth:`dpivreg.privacy.units.UnitFacts.as_dict`: the unit,
        the number of units, the rows each may contribute, the clusters and their number); ``nobs`` is then the
        released estimate of the row count, and ε is per unit. None for row-level privacy without clusters.
    cautions : tuple of str
        The fit's cautions (:attr:`DPIVResults.cautions <dpivreg.reporting.results.DPIVResults.cautions>`:
        unreliable standard errors, weak instruments, what the release cannot resolve).
    iv_tests : tuple of dict
        The fit's IV tests (:attr:`DPIVResults.iv_tests <dpivreg.reporting.results.DPIVResults.iv_tests>`), one dict
        per test: its name under ``"test"``, then ``statistic``, ``pval``, ``dist``, ``lower``, ``upper``,
        ``critical_value``, ``cost``, ``null`` (NaN where a test has no such number). Empty in records made before
        they were recorded.
    """

    dependent: str
    formula: str | None
    endog_names: tuple[str, ...]
    instrument_names: tuple[str, ...]
    exog_names: tuple[str, ...]
    nobs: int
    estimator: str
    params: pd.Series
    cov: pd.DataFrame | None
    cov_type: str
    path: pd.DataFrame
    first_stage_path: np.ndarray = field(repr=False)
    privacy: PrivacyBudget = field(repr=False)
    delta: float = 1e-5
    settings: dict = field(default_factory=dict, repr=False)
    scaling: dict = field(default_factory=dict, repr=False)
    leaks: tuple[str, ...] = ()
    inference_note: str = ""
    version: str = ""
    created: str = ""
    unit: dict | None = None
    cautions: tuple[str, ...] = ()
    iv_tests: tuple[dict, ...] = ()

    # ------------------------------------------------------------------ the statistics (post-processing)
    @property
    def regressor_names(self) -> list[str]:
        """The regressors, exogenous first (the order of :attr:`params`)."""
        return list(self.params.index)

    @property
    def is_private(self) -> bool:
        """True when the fit spent a finite budget and nothing leaked."""
        return self.privacy.is_private and not self.leaks

    @property
    def epsilon(self) -> float:
        """ε at :attr:`delta` (exact Gaussian conversion)."""
        return self.privacy.epsilon(self.delta)

    @property
    def _has_inference(self) -> bool:
        return self.cov is not None

    @property
    def _dependent_label(self) -> str:
        return self.dependent

    @property
    def _iv_tests_frame(self) -> pd.DataFrame:
        return iv_test_frame(self.iv_tests)

    def cov_params(self) -> pd.DataFrame:
        """The private covariance (a ValueError when the fit made no inference)."""
        if self.cov is None:
            raise ValueError(f"this record has no covariance: private standard errors are {self.inference_note}.")
        return self.cov

    @property
    def bse(self) -> pd.Series:
        """Private standard errors (NaN without inference, so that tables of several fits can hold it)."""
        if self.cov is None:
            return pd.Series(np.nan, index=self.params.index, name="std_error")
        return pd.Series(np.sqrt(np.diag(self.cov.to_numpy())), index=self.params.index, name="std_error")

    # ------------------------------------------------------------------ JSON
    @property
    def summary(self) -> SummaryAccessor:
        """The record's publishable summary, as the fit's: ``rec.summary()`` returns a statsmodels ``Summary``
        (settings and budget, the private parameter table, notes), ``print(rec.summary)`` prints it
        (:func:`dpivreg.reporting.summary.release_summary`)."""
        return SummaryAccessor(self._summary)

    def _summary(self, *, benchmark: bool = False):
        if check_flag(benchmark, "benchmark"):
            raise ValueError("a release record holds no NON-PRIVATE benchmark (by design): call summary() or "
                             "summary(benchmark=False); the benchmark is in the fit's own summary.")
        return release_summary(self)

    def to_dict(self) -> dict:
        """The record as plain Python (lists, numbers, strings): what :meth:`to_json` writes."""
        ci = self.conf_int()
        fields_ = _encode({
            "format": RELEASE_FORMAT,
            "dependent": self.dependent,
            "formula": self.formula,
            "endog_names": list(self.endog_names),
            "instrument_names": list(self.instrument_names),
            "exog_names": list(self.exog_names),
            "regressor_names": self.regressor_names,
            "nobs": int(self.nobs),
            "estimator": self.estimator,
            "params": self.params.to_numpy(),
            "std_errors": self.bse.to_numpy(),
            "conf_int_95": {"lower": ci["lower"].to_numpy(), "upper": ci["upper"].to_numpy()},
            "cov": None if self.cov is None else self.cov.to_numpy(),
            "cov_type": self.cov_type,
            "path": self.path.to_numpy(),
            "first_stage_path": self.first_stage_path,
            "releases": [{f.name: getattr(r, f.name) for f in fields(Release)} for r in self.privacy.releases],
            "budget_asked": self.privacy.target,
            "rho": self.privacy.rho,
            "sampler": self.privacy.sampler,
            "delta": self.delta,
            "epsilon": self.epsilon,
            "settings": self.settings,
            "scaling": self.scaling,
            "leaks": list(self.leaks),
            "inference_note": self.inference_note,
            "version": self.version,
            "created": self.created,
            "unit": self.unit,
            "cautions": list(self.cautions),
            "iv_tests": [dict(test) for test in self.iv_tests],
        })
        return {**fields_, "digest": record_digest(fields_)}

    def to_json(self, path: str | os.PathLike | None = None) -> str | None:
        """The record as standard JSON, one top-level field per line; written to ``path`` when given (then None
        is returned).

        Parameters
        ----------
        path : str or path-like, optional
            File to write (UTF-8).
        """
        lines = [f" {json.dumps(key)}: {json.dumps(value, allow_nan=False, ensure_ascii=False)}"
                 for key, value in self.to_dict().items()]
        text = "{\n" + ",\n".join(lines) + "\n}"
        if path is None:
            return text
        Path(path).write_text(text + "\n", encoding="utf-8")
        return None

    def save(self, path: str | os.PathLike) -> None:
        """Write the record as JSON to ``path`` (:meth:`to_json`)."""
        self.to_json(path)

    @classmethod
    def from_json(cls, text: str) -> FitRelease:
        """Read a record written by :meth:`to_json` (the text, not a path; see :func:`load_release`).

        A record of a fit with privacy leaks is read with a :class:`~dpivreg.PrivacyLeakWarning`.
        """
        def refuse(token: str):
            raise ValueError(f"not a dpivreg release record: the non-standard JSON token {token} (records write "
                             "non-finite numbers as the strings 'inf', '-inf', 'nan').")

        try:
            data = json.loads(text, parse_constant=refuse)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a dpivreg release record (invalid JSON: {exc}).") from None
        except RecursionError:
            raise ValueError("not a dpivreg release record: its JSON is nested too deeply (a record is a flat object "
                             "of fields).") from None
        if not isinstance(data, dict) or data.get("format") != RELEASE_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a dpivreg release record of format {RELEASE_FORMAT!r} (found {found!r}).")
        try:
            record = cls._from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            what = f"field {exc.args[0]!r} is missing" if isinstance(exc, KeyError) else f"{exc}"
            raise ValueError(f"not a valid dpivreg release record: {what}. Was the file edited?") from None
        _check_consistent(record, data)
        _check_digest(data)
        if record.leaks:
            warnings.warn("the release record is of a fit with privacy leaks: " + " ".join(record.leaks),
                          PrivacyLeakWarning, stacklevel=3)
        return record

    @classmethod
    def _from_dict(cls, data: dict) -> FitRelease:
        names = [_text(name, "regressor_names") for name in data["regressor_names"]]
        leaks = data["leaks"]
        if not isinstance(leaks, list) or not all(isinstance(leak, str) for leak in leaks):
            raise ValueError("field 'leaks' must be a list of messages")
        nobs = data["nobs"]
        if isinstance(nobs, bool) or not isinstance(nobs, int) or nobs < 1:
            raise ValueError(f"field 'nobs' must be a positive integer, got {nobs!r}")
        if not isinstance(data["settings"], dict) or not isinstance(data["scaling"], dict):
            raise ValueError("fields 'settings' and 'scaling' must be objects")
        params = pd.Series(_floats(data["params"]), index=names, name="parameter")
        cov = None if data["cov"] is None else pd.DataFrame(_floats(data["cov"]), index=names, columns=names)
        path = _floats(data["path"]).reshape(-1, len(names))
        releases = [Release(r["name"], r["stage"], int(r["steps"]), None if r["clip"] is None else float(r["clip"]),
                            float(r["sensitivity"]), float(r["noise_std"]), float(r["rho"]),
                            None if r.get("grid") is None else float(r["grid"]), float(r.get("rounding", 1.0)))
                    for r in data["releases"]]
        n_z = len(data["exog_names"]) + len(data["instrument_names"])
        theta = _floats(data["first_stage_path"]).reshape(-1, n_z, len(data["endog_names"]))
        return cls(
            dependent=data["dependent"], formula=data["formula"], endog_names=tuple(data["endog_names"]),
            instrument_names=tuple(data["instrument_names"]), exog_names=tuple(data["exog_names"]),
            nobs=nobs, estimator=data["estimator"], params=params, cov=cov, cov_type=data["cov_type"],
            path=pd.DataFrame(path, index=pd.RangeIndex(path.shape[0], name="iteration"), columns=names),
            first_stage_path=theta,
            privacy=PrivacyBudget(releases, {k: float(v) for k, v in data["budget_asked"].items()},
                                  unit=_unit_facts(data.get("unit"))),
            delta=float(data["delta"]), settings=_decoded_settings(data["settings"]),
            scaling={k: {**v, "centre": float(v["centre"]), "scale": float(v["scale"])} if "centre" in v else v
                     for k, v in data["scaling"].items()},
            leaks=tuple(leaks), inference_note=data["inference_note"], version=data["version"],
            created=data["created"], unit=data.get("unit"), cautions=_cautions(data.get("cautions", [])),
            iv_tests=_iv_tests(data.get("iv_tests", [])),
        )

    def equals(self, other: FitRelease) -> bool:
        """True when ``other`` holds the same record (numbers compared exactly, NaN equal to NaN), whenever
        each was made (``created`` is not compared)."""
        if not isinstance(other, FitRelease):
            return False
        mine, theirs = self.to_dict(), other.to_dict()
        for fields_ in (mine, theirs):
            fields_.pop("created")
            fields_.pop("digest")  # a digest of the time too
        return mine == theirs

    def __repr__(self) -> str:
        private = "private" if self.is_private else "NOT private"
        return (f"<FitRelease: {self.dependent} on {', '.join(self.regressor_names)}; "
                f"{size_text(self.nobs, self.privacy.unit)}, "
                f"{self.estimator}, rho={self.privacy.rho:.6g}, epsilon={self.epsilon:.4g} at delta={self.delta:g}; "
                f"{private}>")


def _unit_facts(unit):
    """The record's privacy unit (a dict of :meth:`dpivreg.privacy.units.UnitFacts.as_dict`) as UnitFacts; None when
    absent."""
    if unit is None:
        return None

    if not isinstance(unit, dict) or set(unit) != {"unit", "n_units", "max_rows", "clusters", "n_clusters"}:
        raise ValueError(f"field 'unit' must hold the privacy unit's facts, got {unit!r}")
    for key in ("n_units", "max_rows"):
        if isinstance(unit[key], bool) or not isinstance(unit[key], int) or unit[key] < 1:
            raise ValueError(f"field 'unit' must hold a positive integer {key}, got {unit[key]!r}")
    return UnitFacts(**unit)


def _text(value, field: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"field {field!r} must hold names (text), got {value!r}")
    return value


def _check_consistent(record: FitRelease, data: dict) -> None:
    """The stored summary numbers must follow from the stored releases and covariance (an edited file does not)."""
    derived = record.to_dict()
    for key in ("rho", "epsilon", "std_errors", "conf_int_95"):
        if data[key] != derived[key]:
            raise ValueError(f"not a valid dpivreg release record: the stored {key!r} does not follow from the "
                             "record's releases and covariance. Was the file edited?")
    if any(not r.rho >= 0 for r in record.privacy.releases):
        raise ValueError("not a valid dpivreg release record: a release with a negative or NaN rho.")


def _cautions(value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(note, str) for note in value):
        raise ValueError("field 'cautions' must be a list of messages")
    return tuple(value)


def _iv_tests(value) -> tuple[dict, ...]:
    """The record's IV tests back from JSON: each an object of the test's name and the columns
    :data:`~dpivreg.reporting.tables.IV_TEST_COLUMNS`, the numbers as floats ("inf" and "nan" strings included)."""
    keys = {"test", *IV_TEST_COLUMNS}
    if not isinstance(value, list) or not all(isinstance(test, dict) and set(test) == keys for test in value):
        raise ValueError(f"field 'iv_tests' must be a list of tests, each an object with the fields {sorted(keys)}")
    tests = []
    for test in value:
        for key in keys:
            number = test[key]
            if key not in IV_TEST_NUMBERS:
                _text(number, f"iv_tests.{key}")
            elif isinstance(number, bool) or not (isinstance(number, (int, float)) or number in ("inf", "-inf", "nan")):
                raise ValueError(f"field 'iv_tests' holds {number!r} as the {key} of {test['test']!r}: not a number")
        tests.append({key: float(test[key]) if key in IV_TEST_NUMBERS else test[key]
                      for key in ("test", *IV_TEST_COLUMNS)})
    return tuple(tests)


def record_digest(fields_: dict) -> str:
    """The SHA-256 digest of a record's fields (every field but the digest, as canonical JSON: sorted keys, no
    spaces, ASCII): written with the record and checked when it is read, so that an edited number, count or leak
    is refused (a checksum against editing by mistake or by hand, not a signature: whoever edits the file can
    recompute it)."""
    body = {key: value for key, value in fields_.items() if key != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _check_digest(data: dict) -> None:
    """Refuse a record whose fields do not match its digest; warn for one written before records had one."""
    if "digest" not in data:
        warnings.warn("the release record has no digest (written by an earlier dpivreg): its fields cannot be "
                      "checked against editing; save it again with this version to add one.", UserWarning,
                      stacklevel=4)
        return
    if data["digest"] != record_digest(data):
        raise ValueError("not a valid dpivreg release record: its fields do not match its digest, so the file was "
                         "edited after it was written (a number, the row count, a release's noise or the leaks). "
                         "Make the record again from the fit: res.release().save(path).")


def _decoded_settings(settings: dict) -> dict:
    """Settings back from JSON: the float-valued entries written as "inf"/"nan" strings become floats."""
    out = {}
    for key, value in settings.items():
        if value in ("inf", "-inf", "nan"):
            value = float(value)
        out[key] = value
    return out


def load_release(path: str | os.PathLike) -> FitRelease:
    """Read a :class:`FitRelease` saved with :meth:`FitRelease.save` (or :meth:`~FitRelease.to_json`).

    Parameters
    ----------
    path : str or path-like
        The JSON file.

    Returns
    -------
    FitRelease
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no release record at {str(path)!r}: give the path of a file written by FitRelease.save.")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not a dpivreg release record: {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
                         f"{exc.start}); records are JSON written by FitRelease.save.") from None
    return FitRelease.from_json(text)


def record_time() -> str:
    """Now, to the second, in ISO 8601 with the UTC offset."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
