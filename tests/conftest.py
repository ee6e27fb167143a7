"""Shared seeded fixtures, and deterministic property tests."""

from hypothesis import settings
import pytest

from ivsim import simulate_iv_arrays

# The property tests draw the same examples on every run (CI included): a failure is reproducible from the
# commit alone, never a different example set per machine. Explore new examples locally with
# --hypothesis-profile=explore.
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile("fixed")


@pytest.fixture
def iv_data():
    Z, X, Y, beta, theta = simulate_iv_arrays(2000, 3, 4, seed=20261129)
    return Z, X, Y
