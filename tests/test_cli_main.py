"""The CLI shell: a reader that goes away early (`| head`) ends the command quietly, without a traceback."""

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_closed_stdout_exits_141_without_traceback():
    nodes = ",".join(str(n) for n in range(1, 3001))  # ~200 KB of JSON: more than a pipe buffer holds
    cmd = [sys.executable, "-m", "dpcomm", "simulate", "--trace", "lenet5", "--nodes", nodes, "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(5) == b'[{"no'
    proc.stdout.close()  # the reader goes away, as `head -c 5` does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err.decode()
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
