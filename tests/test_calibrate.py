"""``dpcomm calibrate``: the fit on known lines, bad arguments (exit 2, one line), and one real 2-worker run.

Budget: one launch of 2 gloo workers with 3 small sizes (a few seconds); the rest is pure.
"""

import math

import pytest

from dpcomm.cli.main import main
from dpcomm.costmodel import MeasuredCost, allreduce_cost, load_network
from dpcomm.costmodel.calibrate import ring_alpha_beta
from dpcomm.costmodel.fit import fit_line


def fit_linear(points, fit="relative"):
    line = fit_line(points, weighting=fit)
    return (*line.coef, line.r2)


@pytest.mark.parametrize("fit", ["relative", "ols"])
def test_fit_recovers_an_exact_line(fit):
    # t = 50 us + 1 ns/byte at 4 KB .. 64 MB
    pts = [(m, 50e-6 + 1e-9 * m) for m in (4096, 65536, 1 << 20, 1 << 26)]
    a, b, r2 = fit_linear(pts, fit)
    assert (
        a == pytest.approx(50e-6, rel=1e-9)
        and b == pytest.approx(1e-9, rel=1e-9)
        and r2 == pytest.approx(1.0)
    )


def test_relative_fit_keeps_the_startup_that_ols_loses():
    # the 64 MB point is 20% slow (noise): OLS is pulled by it and its intercept goes wrong (negative),
    # the relative fit keeps a within a few percent of the true 50 us
    pts = [(m, 50e-6 + 1e-9 * m) for m in (4096, 16384, 65536, 262144, 1 << 20, 1 << 22, 1 << 24)]
    pts.append((1 << 26, 1.2 * (50e-6 + 1e-9 * (1 << 26))))
    a_ols, _, r2_ols = fit_linear(pts, "ols")
    a_rel, _, r2_rel = fit_linear(pts, "relative")
    assert a_ols < 0 < a_rel and abs(a_rel - 50e-6) / 50e-6 < 0.1
    assert 0 < r2_ols < 1 and 0 < r2_rel < 1
    with pytest.raises(ValueError):
        fit_linear([(4096, 1e-4), (4096, 2e-4)])


def test_ring_inversion():
    # a = 2(N-1) alpha -> alpha = 633.64 us / 14 = 45.26 us;
    # b = 2(N-1)/N beta -> beta = 1.4 ns * 8/14 = 0.8 ns
    alpha, beta = ring_alpha_beta(633.64e-6, 1.4e-9, 8)
    assert alpha == pytest.approx(45.26e-6) and beta == pytest.approx(0.8e-9)
    assert ring_alpha_beta(-1e-6, 1e-9, 2) == (0.0, pytest.approx(1e-9))  # negative a clamps to 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--nproc", "1"], "--nproc must be an integer >= 2"),
        (["--nproc", "two"], "--nproc must be an integer"),
        (["--nproc", "2", "--sizes", "4K"], "at least two different sizes"),
        (["--nproc", "2", "--sizes", "4K", "lots"], "cannot read 'lots'"),
        (["--nproc", "2", "--iters", "0"], "--iters must be >= 1"),
        (["--nproc", "2", "--fit", "median"], "--fit must be one of"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, words):
    out = tmp_path / "net.json"
    assert main(["calibrate", *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpcomm: error: ") and words in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.slow
def test_calibrate_two_workers_writes_a_valid_network(tmp_path, capsys):
    out = tmp_path / "net.json"
    rc = main(
        [
            "calibrate",
            "--nproc",
            "2",
            "--sizes",
            "4K,64K",
            "256K",
            "--iters",
            "3",
            "--warmup",
            "1",
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "R^2 = " in printed and "alpha" in printed and str(out) in printed
    net = load_network(out)  # validates the whole file
    table = net.allreduce_tables[2]
    assert [m for m, _ in table] == [4096.0, 65536.0, 262144.0]
    assert all(t > 0 and math.isfinite(t) for _, t in table)
    assert net.alpha >= 0 and net.beta >= 0 and "calibrate --nproc 2" in net.source
    r2 = float(printed.split("R^2 = ")[-1].split()[0])
    assert r2 <= 1.0
    cost = allreduce_cost(net, 2)
    assert isinstance(cost, MeasuredCost) and cost(65536.0) == max(t for m, t in table if m <= 65536.0)
