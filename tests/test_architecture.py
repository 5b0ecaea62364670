"""Architecture rules of DESIGN.md, checked on the source: dependency direction and where
transformers/accelerate may be imported."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# import name -> import names it may use (DESIGN.md: sparse-kernels <- modality-index,
# sparse-patterns <- triangle-mix, seqpar-approx <- apps).
ALLOWED = {
    "sparse_kernels": set(),
    "modality_index": {"sparse_kernels"},
    "sparse_patterns": {"sparse_kernels", "modality_index"},
    "triangle_mix": {"sparse_kernels", "modality_index", "sparse_patterns"},
    # Spava hosts run MMInference and TriangleMix steps (the `sparse` extra, imported lazily): an
    # import across the tier of triangle-mix and seqpar-approx, never back down-to-up.
    "seqpar_approx": {"sparse_kernels", "modality_index", "sparse_patterns", "triangle_mix"},
    "vlm_accel": {"sparse_kernels", "modality_index", "sparse_patterns", "triangle_mix"},
    "spava_run": {
        "sparse_kernels",
        "modality_index",
        "sparse_patterns",
        "triangle_mix",
        "seqpar_approx",
    },
}
OURS = set(ALLOWED)
HEAVY = {"transformers", "accelerate"}
APPS = {"vlm_accel", "spava_run"}


def _sources():
    for pkg in sorted(OURS):
        for src in ROOT.glob(f"*/*/src/{pkg}"):
            for f in sorted(src.rglob("*.py")):
                yield pkg, f


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_sources_found():
    found = {pkg for pkg, _ in _sources()}
    assert "sparse_kernels" in found


@pytest.mark.parametrize(
    "pkg,path", [pytest.param(p, f, id=str(f.relative_to(ROOT))) for p, f in _sources()]
)
def test_dependency_direction(pkg, path):
    used = _imports(path) & OURS - {pkg}
    bad = used - ALLOWED[pkg]
    assert not bad, (
        f"{path.relative_to(ROOT)} ({pkg}) imports {sorted(bad)} against DESIGN.md's direction"
    )
    if pkg not in APPS and "integrations" not in path.parts:
        heavy = _imports(path) & HEAVY
        assert not heavy, (
            f"{path.relative_to(ROOT)} imports {sorted(heavy)}; only <pkg>/integrations/ modules and apps may"
        )


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "nox -s tests" in readme and "nox -s tests" in ci
