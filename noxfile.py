"""Sessions: tests (CPU, Triton interpreter), gpu-tests (compiled, on a CUDA machine), bench, lint.

`tests` and `lint` build a uv environment from the lock file. `gpu-tests` and `bench` run in the
Python that nox itself runs in (GPU machines have torch/triton/transformers preinstalled and no
network), with the workspace's source folders on PYTHONPATH.
"""

from __future__ import annotations

import os
import pathlib
import sys

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "lint"]

ROOT = pathlib.Path(__file__).parent
SRC_DIRS = sorted(str(p) for p in ROOT.glob("*/*/src"))
TEST_DIRS = ["packages", "apps", "tests"]


def _uv_sync(session: nox.Session, *groups: str) -> None:
    args = ["uv", "sync", "--frozen", "--all-packages", "--no-default-groups"]
    for g in groups:
        args += ["--group", g]
    session.run_install(*args, env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location})


@nox.session
def tests(session: nox.Session) -> None:
    """Every package's tests and the root tests on CPU; Triton kernels under the interpreter."""
    _uv_sync(session, "test")
    session.run(
        "python", "-m", "pytest", *TEST_DIRS, "-m", "not slow and not gpu", "-p", "no:cacheprovider",
        *session.posargs,
        env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip


def _system_python_env() -> dict[str, str]:
    path = os.pathsep.join(SRC_DIRS + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path, "TRITON_INTERPRET": "0"}


@nox.session(name="gpu-tests", venv_backend="none")
def gpu_tests(session: nox.Session) -> None:
    """The same tests compiled on a CUDA GPU (bf16 and real sizes included), plus `gpu` tests.

    Kernels compile only their first autotune config here (compiling every config for every
    head dim and dtype takes minutes); `test_every_autotune_config_is_correct` checks each config.
    """
    env = {**_system_python_env(), "SPARSE_KERNELS_AUTOTUNE": "0"}
    session.run(
        sys.executable, "-c",
        "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu-tests needs a CUDA GPU')",
        env=env,
    )  # fmt: skip
    # Paths given after `--` narrow the run; without them pytest's testpaths (all packages) apply.
    session.run(
        sys.executable, "-m", "pytest", "-m", "not slow", "-p", "no:cacheprovider",
        *session.posargs, env=env,
    )  # fmt: skip


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """pytest-benchmark suites on a GPU; JSON results in docs/benchmarks/<gpu>-<date>.json."""
    import datetime
    import subprocess

    env = _system_python_env()
    gpu = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_device_name().replace(' ', '-'))"],
        capture_output=True, text=True, env={**os.environ, **env}, check=True,
    ).stdout.strip()  # fmt: skip
    out_dir = pathlib.Path(os.environ.get("BENCH_OUT", ROOT / "docs" / "benchmarks"))
    out = out_dir / f"{gpu}-{datetime.date.today().isoformat()}.json"
    # Benchmark files (or -k filters) given after `--` narrow the run.
    paths = [a for a in session.posargs if not a.startswith("-")]
    flags = [a for a in session.posargs if a.startswith("-")]
    benches = paths or sorted(str(p) for p in ROOT.glob("*/*/benchmarks"))
    session.run(
        sys.executable, "-m", "pytest", *benches, "--benchmark-only", f"--benchmark-json={out}",
        "-p", "no:cacheprovider", "-o", "python_files=bench_*.py", *flags, env=env,
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check + ruff format --check."""
    session.install("ruff>=0.8")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
