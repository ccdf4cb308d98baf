"""Output files: a regular file is replaced atomically with the umask's or the old file's mode, a link is
written through to its target, a device or FIFO is written in place, a folder is a one-line error."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from dpcomm.errors import UserError
from dpcomm.utils.io import atomic_write_text, check_output_path, read_json


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_new_file_gets_the_umask_mode(tmp_path, umask_022):
    atomic_write_text(tmp_path / "new.json", "{}")
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644  # 0o666 & ~0o022, as open() gives


def test_a_replaced_file_keeps_its_mode_and_nothing_else_is_left(tmp_path, umask_022):
    path = tmp_path / "out.json"
    path.write_text("old")
    path.chmod(0o640)
    atomic_write_text(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_link_is_written_through_to_its_target(tmp_path):
    target = tmp_path / "data" / "target.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "data" / "later.json")
    atomic_write_text(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "data" / "later.json").read_text() == "made"


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    atomic_write_text(fifo, "through the pipe")
    reader.join(timeout=10)
    assert got == ["through the pipe"] and stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_node_is_written_in_place(tmp_path):
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    atomic_write_text(null, "gone")
    assert stat.S_ISCHR(null.stat().st_mode)  # still the device, not a regular file


def test_a_folder_is_one_line_before_and_at_the_write(tmp_path):
    for path in (tmp_path, f"{tmp_path}/new/"):
        with pytest.raises(UserError, match="folder"):
            check_output_path(path)
    with pytest.raises(UserError, match="is a folder"):
        atomic_write_text(tmp_path, "x")
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is not a folder"):
        check_output_path(tmp_path / "file" / "out.json")
    with pytest.raises(UserError, match="no folder"):  # a folder that does not exist is not created
        check_output_path(tmp_path / "a" / "b" / "out.json")
    assert not (tmp_path / "a").exists()
    deep = tmp_path / "a" / "b" / "out.json"
    assert check_output_path(deep, make_folders=True) == deep  # a library caller may ask for them


def test_deep_json_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="nested too deeply"):
        read_json(path)
