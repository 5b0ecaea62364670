"""Sessions: tests (CPU, Triton interpreter), gpu-tests (compiled, on a CUDA machine), bench, lint,
build (every wheel and sdist, checked and installed alone).

`tests` and `lint` build a uv environment from the lock file. `gpu-tests` and `bench` run in the
Python that nox itself runs in (GPU machines have torch/triton/transformers preinstalled and no
network), with the workspace's source folders on PYTHONPATH.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import zipfile

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests", "lint"]

ROOT = pathlib.Path(__file__).parent
SRC_DIRS = sorted(str(p) for p in ROOT.glob("*/*/src"))
TEST_DIRS = ["packages", "apps", "tests"]
# Each distribution's self-check, run from the bin folder of a venv that holds only its wheel and
# what that wheel declares.
SELF_CHECKS = {
    "sparse-kernels": ["python", "-m", "sparse_kernels"],
    "modality-index": ["python", "-m", "modality_index"],
    "sparse-patterns": ["python", "-m", "sparse_patterns"],
    "triangle-mix": ["python", "-m", "triangle_mix"],
    "seqpar-approx": ["python", "-m", "seqpar_approx"],
    "vlm-accel": ["vlm-accel", "--version"],
    "spava-run": ["spava-run", "--version"],
}


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

    Kernels launch the looked-up config of each call (no run-time tuning);
    `test_every_candidate_config_is_correct` runs every candidate a tuned table may name.
    """
    env = _system_python_env()
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
    """pytest-benchmark suites on a GPU; JSON results in results/<gpu>-<date>.json (the raw data
    behind docs/results.md; BENCH_OUT names another folder)."""
    import datetime
    import subprocess

    env = _system_python_env()
    gpu = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.get_device_name().replace(' ', '-'))"],
        capture_output=True, text=True, env={**os.environ, **env}, check=True,
    ).stdout.strip()  # fmt: skip
    out_dir = pathlib.Path(os.environ.get("BENCH_OUT", ROOT / "results"))
    out = out_dir / f"{gpu}-{datetime.date.today().isoformat()}.json"
    # Arguments after `--` go to pytest as they are (`-- -k grid`, `-- path/bench_x.py`); without
    # a benchmark file or folder among them, every package's benchmarks run.
    given = any(pathlib.Path(a.split("::")[0]).exists() for a in session.posargs)
    benches = [] if given else sorted(str(p) for p in ROOT.glob("*/*/benchmarks"))
    session.run(
        sys.executable, "-m", "pytest", *benches, "--benchmark-only", f"--benchmark-json={out}",
        "-p", "no:cacheprovider", "-o", "python_files=bench_*.py", *session.posargs, env=env,
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check + ruff format --check."""
    session.install("ruff>=0.8")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def _wheel_record(wheel: pathlib.Path) -> set[str]:
    """The ``path,hash`` lines of the wheel's own files (its dist-info folder left out)."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        lines = z.read(name).decode().splitlines()
    return {ln.rsplit(",", 1)[0] for ln in lines if ln and ".dist-info/" not in ln}


def _ours_installed(wheels: dict[str, pathlib.Path], venv: pathlib.Path) -> dict[str, bool]:
    """Each of our distributions installed in ``venv`` -> whether its files are those of the
    locally built wheel (an index may hold a distribution of the same name and version)."""
    found = {}
    for record in sorted(venv.glob("lib/python*/site-packages/*.dist-info/RECORD")):
        name = record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        dist = name.replace("_", "-").lower()
        if dist in wheels:
            installed = {ln.rsplit(",", 1)[0] for ln in record.read_text().splitlines()}
            found[dist] = _wheel_record(wheels[dist]) <= installed
    return found


@nox.session
def build(session: nox.Session) -> None:
    """Build every wheel and sdist, check them with twine, then install each wheel alone in a fresh
    venv (third-party dependencies from PyPI at the versions of uv.lock, ours from the built
    wheels) and run its self-check.

    Nothing else of the workspace's configuration reaches those installs (``--no-config``): the
    dependencies are the ones the wheels declare, as a user of the published wheels gets them.
    """
    session.run_install(
        "uv", "sync", "--frozen", "--only-group", "release",
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )  # fmt: skip
    tmp = pathlib.Path(session.create_tmp())
    dist_dir = tmp / "dist"
    shutil.rmtree(dist_dir, ignore_errors=True)
    session.run("uv", "build", "--all-packages", "--out-dir", str(dist_dir))
    built = sorted(p for p in dist_dir.iterdir() if p.name.endswith((".whl", ".tar.gz")))
    session.run("twine", "check", "--strict", *map(str, built))
    wheels = {p.name.split("-", 1)[0].replace("_", "-"): p for p in built if p.suffix == ".whl"}
    sdists = {p.name.rsplit("-", 1)[0].replace("_", "-") for p in built if p.suffix == ".gz"}
    if set(wheels) != set(SELF_CHECKS) or sdists != set(SELF_CHECKS):
        session.error(
            f"expected a wheel and an sdist of each of {sorted(SELF_CHECKS)}, "
            f"got wheels {sorted(wheels)} and sdists {sorted(sdists)}"
        )
    # The tuned launch-config tables are package data: without them every kernel on an H100 or
    # H200 would run its safe config.
    shipped = sorted(
        p.name
        for p in pathlib.Path("packages/sparse-kernels/src/sparse_kernels/tuning/tables").glob(
            "*.json"
        )
    )
    with zipfile.ZipFile(wheels["sparse-kernels"]) as whl:
        in_wheel = sorted(
            n.rsplit("/", 1)[1]
            for n in whl.namelist()
            if n.startswith("sparse_kernels/tuning/tables/")
        )
    if not shipped or in_wheel != shipped:
        session.error(f"sparse-kernels wheel: expected tuned tables {shipped}, got {in_wheel}")
    # Third-party versions as locked: what `nox -s tests` ran, and already in uv's cache.
    constraints = tmp / "constraints.txt"
    session.run(
        "uv", "export", "--frozen", "--all-packages", "--all-extras", "--all-groups",
        "--no-emit-workspace", "--no-hashes", "--no-header", "--quiet", "--output-file", str(constraints),
    )  # fmt: skip
    # uv caches a find-links wheel by name and version: without a refresh it would install an
    # earlier build of ours.
    refresh = [arg for dist in SELF_CHECKS for arg in ("--refresh-package", dist)]
    python = str(pathlib.Path(session.bin) / "python")
    for dist, (cmd, *args) in SELF_CHECKS.items():
        venv = tmp / f"venv-{dist}"
        session.run("uv", "venv", "--quiet", "--clear", "--python", python, str(venv))
        session.run(
            "uv", "pip", "install", "--no-config", "--quiet", "--python", str(venv / "bin" / "python"),
            *refresh, "--constraints", str(constraints), "--find-links", str(dist_dir), str(wheels[dist]),
        )  # fmt: skip
        ours = _ours_installed(wheels, venv)
        if dist not in ours or not all(ours.values()):
            session.error(f"{dist}: expected ours from the built wheels, got {ours}")
        session.log(f"{dist}: installed with {', '.join(ours)} from the built wheels")
        out = session.run(str(venv / "bin" / cmd), *args, external=True, silent=True)
        print(out, end="")
        version = wheels[dist].name.split("-")[1]
        if args == ["--version"] and version not in out.split():
            session.error(f"{cmd} --version: expected {version}, got {out!r}")
