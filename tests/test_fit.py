"""The one least-squares fit (:mod:`dpcomm.costmodel.fit`): exact recoveries, the weighting, and the
non-negative solution checked by its optimality (KKT) conditions. Budget: pure numpy, under a second."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcomm.costmodel.fit import fit_least_squares, fit_line


def test_three_parameters_recovered_exactly():
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 1e6, size=(12, 3))
    truth = np.array([3e-5, 2e-9, 4e-10])
    for weighting in ("relative", "ols"):
        got = fit_least_squares(a, a @ truth, weighting=weighting, nonneg=True)
        assert got.coef == pytest.approx(tuple(truth), rel=1e-9) and got.r2 == pytest.approx(1.0)


def test_line_and_bad_input():
    line = fit_line([(m, 1e-4 + 2e-9 * m) for m in (1_000, 4_000, 64_000, 1_000_000)], nonneg=True)
    assert line.coef == pytest.approx((1e-4, 2e-9), rel=1e-9)
    with pytest.raises(ValueError, match="two or more different sizes"):
        fit_line([(4096, 1e-4), (4096, 2e-4)])
    with pytest.raises(ValueError, match="weighting"):
        fit_line([(1, 1.0), (2, 2.0)], weighting="nope")
    # falling times (noise): the unconstrained slope is negative, the non-negative one is not
    pts = [(1_000, 5e-4), (100_000, 4e-4)]
    assert fit_line(pts).coef[1] < 0 and min(fit_line(pts, nonneg=True).coef) >= 0


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(3, 10),
    params=st.integers(1, 3),
    weighting=st.sampled_from(["relative", "ols"]),
)
def test_nonneg_fit_meets_the_kkt_conditions(seed, rows, params, weighting):
    """The non-negative least-squares optimum: the weighted gradient is 0 on free parameters and >= 0 on
    those held at 0."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.1, 1.0, size=(rows, params))
    t = rng.uniform(0.1, 1.0, size=rows)
    fit = fit_least_squares(a, t, weighting=weighting, nonneg=True)
    x = np.array(fit.coef)
    w = 1 / t**2 if weighting == "relative" else np.ones_like(t)
    grad = a.T @ (w * (a @ x - t))
    scale = float(np.abs(a.T @ (w * t)).max())
    assert (x >= 0).all()
    for j in range(params):
        if x[j] > 1e-12:
            assert abs(grad[j]) <= 1e-8 * scale
        else:
            assert grad[j] >= -1e-8 * scale
