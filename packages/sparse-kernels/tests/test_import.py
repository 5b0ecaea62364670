"""Importing the package does not import Triton: Triton reads ``TRITON_INTERPRET`` when it is
imported, and ``python -m sparse_kernels`` (and users without a GPU) turn the interpreter on after
the package is imported."""

import subprocess
import sys


def test_import_does_not_import_triton():
    code = (
        "import sys, sparse_kernels, sparse_kernels.grid_index, sparse_kernels.permuted; "
        "print('triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
