"""Smoke tests of the example scripts: each runs with ``--quick`` in a subprocess and writes its files.

The four scripts run concurrently (started together, then awaited) so the whole file stays
well under a minute even on a busy machine. ``error_vs_n.py`` (the README's command) runs without
``--outdir``, from an empty directory: its files must land in ``dpivreg-output/error_vs_n/`` there,
and no script may touch the committed figures and tables in ``docs/_static/reproduction/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TIMEOUT = 120
COMMITTED = ROOT / "docs" / "_static" / "reproduction"
DEFAULT_OUTDIR_SCRIPT = "error_vs_n.py"  # run without --outdir

# script -> {output file: expected CSV columns (None for a figure)}
EXPECTED = {
    "quickstart.py": {},
    "panel.py": {"panel.csv": ["coefficient", "true", "row-level estimate", "row-level s.e.", "household-level estimate",
                               "household-level s.e.", "clustered 2SLS (NON-PRIVATE)",
                               "clustered 2SLS s.e. (NON-PRIVATE)"]},
    "error_vs_n.py": {
        "error_vs_n.png": None,
        "error_vs_n.csv": ["setting", "p", "q", "n", "rho1", "rho2", "rho0", "rho_total_asked", "rho_total_spent",
                           "runs", "failures", "mean_error", "se_error", "median_error"],
    },
    "error_vs_T.py": {
        "error_vs_T.png": None,
        "error_vs_T.csv": ["panel", "n", "p", "q", "rho1", "rho2", "T", "runs", "failures", "mean_error",
                           "se_error", "median_error"],
        "error_vs_T_minima.csv": ["panel", "rho1", "rho2", "T_min_measured", "min_mean_error", "min_se",
                                  "T_within_10pct", "error_at_T_max", "plan_recommended_T",
                                  "plan_recommended_T_kappa_data", "kappa_data", "t_condition_limit"],
    },
    "angrist.py": {
        "angrist.png": None,
        "angrist_summary.csv": ["setting", "formula", "n", "runs", "failures", "rho_total_asked", "rho_total_spent",
                                "beta_2sls", "theta_first_stage", "median", "mean", "sd", "q05", "q25", "q75", "q95",
                                "share_within_2_of_2sls", "iterations_to_converge"],
        "angrist_runs.csv": ["setting", "run", "beta_kids_T", "theta_samesex_T"],
        "angrist_paths.csv": ["setting", "iteration", "beta_kids_mean", "beta_kids_se", "theta_samesex_mean",
                              "theta_samesex_se"],
    },
}


def committed_files() -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(COMMITTED.iterdir()) if path.is_file()}


@pytest.fixture(scope="module")
def committed_before():
    return committed_files()


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory, committed_before):
    """Start every script with --quick at once; return {script: (CompletedProcess-like, outdir)}."""
    env = {**os.environ, "MPLBACKEND": "Agg", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    started = {}
    for script in EXPECTED:
        if script == DEFAULT_OUTDIR_SCRIPT:
            cwd = tmp_path_factory.mktemp("cwd")
            outdir, outdir_args = cwd / "dpivreg-output" / script.removesuffix(".py"), []
        else:
            cwd = ROOT
            outdir = tmp_path_factory.mktemp(script.removesuffix(".py"))
            outdir_args = ["--outdir", str(outdir)]
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLES / script), "--quick", *outdir_args],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        started[script] = (proc, outdir)
    results = {}
    for script, (proc, outdir) in started.items():
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results[script] = (proc.returncode, out, err, outdir)
    return results


@pytest.mark.parametrize("script", list(EXPECTED))
def test_script_runs_and_writes_outputs(quick_runs, script):
    code, out, err, outdir = quick_runs[script]
    assert code == 0, f"{script} --quick exited with {code}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
    for name, columns in EXPECTED[script].items():
        path = outdir / name
        assert path.is_file() and path.stat().st_size > 0, f"{script} did not write {name}"
        if columns is not None:
            df = pd.read_csv(path)
            assert list(df.columns) == columns
            assert len(df) > 0


def test_quickstart_prints_summary_and_plan(quick_runs):
    code, out, err, _ = quick_runs["quickstart.py"]
    assert code == 0, err[-3000:]
    assert "Estimation Summary" in out and "IV2SLS*" in out
    assert "recommended T" in out


def test_reproduction_scripts_print_paper_vs_measured(quick_runs):
    for script in ("error_vs_n.py", "error_vs_T.py", "angrist.py"):
        code, out, _, _ = quick_runs[script]
        assert code == 0
        assert "paper says" in out, f"{script} does not print its paper-says / we-measured table"


def test_default_outdir_is_under_the_current_directory_not_the_docs(quick_runs, committed_before):
    """Without --outdir a script writes into ./dpivreg-output/<script>/ and says so; the committed
    figures and tables are left alone (they are regenerated only with an explicit --outdir)."""
    code, out, err, outdir = quick_runs[DEFAULT_OUTDIR_SCRIPT]
    assert code == 0, err[-3000:]
    assert outdir.parts[-2:] == ("dpivreg-output", "error_vs_n") and any(outdir.iterdir())
    assert "dpivreg-output" in out
    assert committed_files() == committed_before, "a --quick run changed docs/_static/reproduction/"


@pytest.mark.parametrize("script", ["error_vs_n.py", "error_vs_T.py", "angrist.py"])
def test_help_names_the_default_outdir(script):
    run = subprocess.run([sys.executable, str(EXAMPLES / script), "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    help_text = "".join(run.stdout.split())  # argparse wraps lines, also at hyphens
    assert f"dpivreg-output/{script.removesuffix('.py')}/" in help_text
    assert "--outdirdocs/_static/reproduction" in help_text
