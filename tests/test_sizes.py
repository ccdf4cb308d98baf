"""One byte-size reader (:mod:`dpcomm.utils.sizes`): "16MB" is 16 * 2**20 bytes in every place that takes a
size. Budget: pure functions, well under a second."""

import argparse

import pytest

from dpcomm.errors import UserError
from dpcomm.utils.sizes import parse_size, parse_sizes

MB16 = 16 * 2**20  # bytes: binary, as torch's DDP reads bucket_cap_mb


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("16MB", MB16),
        ("16MiB", MB16),
        ("16M", MB16),
        ("16mb", MB16),
        (" 16 MB ", MB16),
        ("4096", 4096),
        ("4KB", 4096),
        ("1.5KiB", 1536),
        ("12.5MB", 13_107_200),
        ("2G", 2**31),
        ("7B", 7),
        ("0", 0),
    ],
)
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["abc", "-1MB", "5XB", "", "MB", "1e3", "16MBB", "16 M B"])
def test_parse_size_rejects_in_one_line(text):
    with pytest.raises(UserError, match="^--sizes: cannot read") as err:
        parse_size(text, what="--sizes")
    assert "\n" not in str(err.value)


def test_minimum_and_lists():
    with pytest.raises(UserError, match="below 1 byte"):
        parse_size("0.0001K", minimum=1)
    assert parse_sizes("4, 1K ,16MB") == (4, 1024, MB16)
    assert parse_sizes(["1M,16MB", "16MiB", "1K"]) == (2**20, MB16, 1024)  # duplicates dropped, order kept
    with pytest.raises(UserError, match="at least one size"):
        parse_sizes(" , ")


@pytest.mark.parametrize("text", ["1.5", "0.5B", "4.", "1024.0"])
def test_a_byte_count_is_whole_or_has_a_unit(text):
    """``--memory 1.5`` was read as 1 byte: a fraction of a byte is a typo, refused; a unit makes it fine."""
    with pytest.raises(UserError, match="is not a whole number of bytes"):
        parse_size(text)
    assert parse_size("1.5K") == 1536


@pytest.mark.parametrize("text", ["1M,,", ",4K", "4K,,16MB", ["4K", ""], ["4K", "1M,"]])
def test_an_empty_entry_in_a_list_is_refused(text):
    """``netsim --sizes 1M,,`` was read as ``1M``."""
    with pytest.raises(UserError, match="has an empty size"):
        parse_sizes(text, what="--sizes")


def test_16mb_in_the_bucket_planner():
    from dpcomm.planner import DDP_BUCKET_BYTES, parse_bucket_size

    assert parse_bucket_size("16MB") == MB16 and parse_bucket_size("25MB") == DDP_BUCKET_BYTES
    with pytest.raises(UserError, match="bucket size"):
        parse_bucket_size("0")


def test_16mb_in_dpcomm_bench():
    from dpcomm.cli import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    cfg = bench.config_from_args(parser.parse_args(["--nproc", "2", "--algos", "ring", "--sizes", "1K,16MB"]))
    assert cfg.sizes == (1024, MB16)


def test_16mb_in_dpcomm_calibrate(monkeypatch):
    from dpcomm.cli.main import main
    from dpcomm.costmodel import calibrate as cal

    seen = {}

    def fake(opts):
        seen["sizes"] = opts.sizes
        raise UserError("stop here")

    monkeypatch.setattr(cal, "calibrate", fake)
    assert main(["calibrate", "--nproc", "2", "--sizes", "4K", "16MB", "-o", "/dev/null"]) == 2
    assert seen["sizes"] == (4096, MB16)
