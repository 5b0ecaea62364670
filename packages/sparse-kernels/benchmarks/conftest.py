"""Without a CUDA GPU every benchmark here is collected (so its imports and parameters are
checked) and skipped with the reason."""

import pathlib

import pytest
import torch

HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="benchmarks need a CUDA GPU")
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(skip)
