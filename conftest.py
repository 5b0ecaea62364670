"""Root pytest configuration shared by every package's tests.

Without a CUDA GPU the Triton kernels run under the Triton interpreter: TRITON_INTERPRET must be
set before any kernel module is imported, so it is set here, before collection.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    n_gpus = torch.cuda.device_count() if HAS_CUDA else 0
    skip_multi = pytest.mark.skip(reason=f"needs 2+ CUDA GPUs, found {n_gpus}")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and n_gpus < 2:
            item.add_marker(skip_multi)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    if HAS_CUDA:
        # Give cached blocks back after each test: `nox -s gpu-tests -- -n N` runs N workers on
        # one GPU, and a worker that keeps a 20 GiB cache starves the others.
        torch.cuda.empty_cache()
