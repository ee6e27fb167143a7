"""Shared seeded fixtures."""

import pytest

from ivsim import simulate_iv_arrays


@pytest.fixture
def iv_data():
    Z, X, Y, beta, theta = simulate_iv_arrays(2000, 3, 4, seed=20261129)
    return Z, X, Y
