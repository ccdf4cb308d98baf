"""Session settings for the whole suite.

The fast tier runs on every core through pytest-xdist (``make test-fast``: ``-n auto --dist loadfile``, a
test file's tests stay in one worker so its module fixtures are built once). There each worker process gets
one torch thread: two workers with torch's default of one thread per core would oversubscribe the cores
and spin (measured on the 2-core VM: a GoogLeNet step 2-4x slower while the other worker computes).
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)
