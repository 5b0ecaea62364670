"""Architecture rules of DESIGN.md and STYLE.md, checked on the source: dependency direction,
where transformers/accelerate may be imported, no private or Triton module imported across
packages, no process-global mutable switch, and no source file over 400 lines without a reason.
Each checker is a function of a file's text, so the tests at the bottom feed it bad snippets."""

from __future__ import annotations

import ast
import pathlib
import re

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
MAX_LINES = 400

# Module-level mutable containers that may stay in src/, "path:NAME" -> why (one line each).
# Anything else that a module keeps across calls belongs to an object its caller owns.
MUTABLE_ALLOWED = {
    "packages/sparse-kernels/src/sparse_kernels/_triton/launch.py:_KERNELS": (
        "compiled Triton kernels by specialization key, bounded by _MAX_KERNELS: the direct "
        "launch path's lookup, a pure cache of what Triton itself caches per process"
    ),
}


def _sources():
    for pkg in sorted(OURS):
        for src in ROOT.glob(f"*/*/src/{pkg}"):
            for f in sorted(src.rglob("*.py")):
                yield pkg, f


def _all_python():
    """``(owner, path)`` of every Python file that may import our packages: each package's
    and app's src, tests and benchmarks (owner: its import name), the root tests and scripts
    (owner None)."""
    for tree in sorted([*ROOT.glob("packages/*"), *ROOT.glob("apps/*")]):
        src = sorted(p.name for p in (tree / "src").glob("*") if (p / "__init__.py").exists())
        owner = src[0] if src else None
        for part in ("src", "tests", "benchmarks"):
            for f in sorted((tree / part).rglob("*.py")):
                yield owner, f
    for part in ("tests", "scripts"):
        for f in sorted((ROOT / part).rglob("*.py")):
            yield None, f


def _tests_and_benchmarks():
    return [f for _, f in _all_python() if "src" not in f.relative_to(ROOT).parts]


def _rel(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


# ---- checkers: each takes a file's text and returns its violations as "line: what" ----


def _private_segment(segment: str) -> bool:
    """A module path segment that is not public: ``_x`` (not a dunder) or a Triton module
    (``triton``, ``<op>_triton``)."""
    dunder = segment.startswith("__") and segment.endswith("__")
    return (
        (segment.startswith("_") and not dunder)
        or segment == "triton"
        or (segment.endswith("_triton"))
    )


def private_imports(source: str, owner: str | None) -> list[str]:
    """Imports by a file of package ``owner`` (None: outside every package) of another of our
    packages' private names, private modules or Triton modules."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found = [(a.name, ()) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [(node.module, [a.name for a in node.names])]
        else:
            continue
        for mod, names in found:
            parts = mod.split(".")
            if parts[0] not in OURS or parts[0] == owner:
                continue
            if any(_private_segment(p) for p in parts[1:]):
                bad.append(f"{node.lineno}: imports module {mod}")
                continue
            bad.extend(
                f"{node.lineno}: imports {n} from {mod}" for n in names if _private_segment(n)
            )
    return bad


_MUTABLE_CALLS = {
    "dict",
    "list",
    "set",
    "bytearray",
    "defaultdict",
    "OrderedDict",
    "Counter",
    "deque",
    "WeakKeyDictionary",
    "WeakValueDictionary",
    "WeakSet",
    "ContextVar",
}
_MUTABLE_NODES = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, _MUTABLE_NODES):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        return name in _MUTABLE_CALLS
    return False


def _module_level(body: list[ast.stmt]):
    """Statements that run once per process: the module's, its classes' and those inside
    module-level ``if``/``try``/``with`` blocks (not function bodies)."""
    for node in body:
        yield node
        if isinstance(node, ast.ClassDef):
            yield from _module_level(node.body)
        elif isinstance(node, (ast.If, ast.For, ast.While)):
            yield from _module_level(node.body + node.orelse)
        elif isinstance(node, ast.With):
            yield from _module_level(node.body)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body + node.orelse + node.finalbody)
            for h in node.handlers:
                yield from _module_level(h.body)


def _import_time(tree: ast.Module):
    """Every node that runs when the module is imported (function bodies aside)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _reads_environment(node: ast.AST) -> bool:
    """``os.environ`` or ``os.getenv``."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ("environ", "getenv")
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def global_switches(source: str) -> list[str]:
    """``global`` statements, the environment read at import (a switch fixed for the process),
    and module- or class-level mutable containers (literals, comprehensions,
    ``dict()``/``list()``/``set()``/``defaultdict()``/..., ``ContextVar``); dunders such as
    ``__all__`` aside. Returns ``"line: what"``, a container's name after ``NAME=``."""
    tree = ast.parse(source)
    bad = [
        f"{n.lineno}: global {', '.join(n.names)}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Global)
    ]
    bad += sorted(
        {
            f"{n.lineno}: reads the environment at import"
            for n in _import_time(tree)
            if _reads_environment(n)
        }
    )
    for node in _module_level(tree.body):
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        if not _is_mutable(value):
            continue
        for t in targets:
            name = t.id if isinstance(t, ast.Name) else ast.unparse(t)
            if not (name.startswith("__") and name.endswith("__")):
                bad.append(f"{node.lineno}: NAME={name} is a mutable container")
    return bad


_SWITCH = re.compile(r"_?[A-Z][A-Z0-9_]*")


def _our_module_names(tree: ast.Module) -> set[str]:
    """Names a file binds to our modules or objects by import."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in OURS:
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").split(".")[0] in OURS
        ):
            names.update(a.asname or a.name for a in node.names)
    return names


def switch_patches(source: str) -> list[str]:
    """``monkeypatch.setattr(<our module>, "UPPER_NAME", ...)`` and
    ``monkeypatch.setattr("our_pkg.mod.UPPER_NAME", ...)``: a test flipping a module-level
    setting of our src, which should be an argument or a field of an object instead."""
    tree = ast.parse(source)
    ours = _our_module_names(tree)
    bad = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setattr"
            and node.args
        ):
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            parts = first.value.split(".")
            if parts[0] in OURS and _SWITCH.fullmatch(parts[-1]):
                bad.append(f"{node.lineno}: patches {first.value}")
            continue
        if len(node.args) < 2:
            continue
        name = node.args[1]
        root = first
        while isinstance(root, ast.Attribute):
            root = root.value
        if (
            isinstance(name, ast.Constant)
            and isinstance(name.value, str)
            and _SWITCH.fullmatch(name.value)
            and isinstance(root, ast.Name)
            and root.id in ours
        ):
            bad.append(f"{node.lineno}: patches {ast.unparse(first)}.{name.value}")
    return bad


def oversize(source: str, limit: int = MAX_LINES) -> str | None:
    """Why a file over ``limit`` lines is that long (its module docstring's line starting
    ``Size:``), ``""`` if it gives none, ``None`` if it is within the limit."""
    if len(source.splitlines()) <= limit:
        return None
    doc = ast.get_docstring(ast.parse(source)) or ""
    return next((ln for ln in doc.splitlines() if ln.strip().startswith("Size:")), "")


# ---- the rules on our files ----


def test_sources_found():
    found = {pkg for pkg, _ in _sources()}
    assert "sparse_kernels" in found
    owners = {o for o, _ in _all_python()}
    assert owners >= OURS, f"packages without sources: {sorted(OURS - owners)}"


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


@pytest.mark.parametrize("owner,path", [pytest.param(o, f, id=_rel(f)) for o, f in _all_python()])
def test_no_private_import_across_packages(owner, path):
    bad = private_imports(path.read_text(), owner)
    assert not bad, (
        f"{_rel(path)}: "
        + "; ".join(bad)
        + (" (another package's private name or Triton module: make it a public op)")
    )


@pytest.mark.parametrize("pkg,path", [pytest.param(p, f, id=_rel(f)) for p, f in _sources()])
def test_no_process_global_switch_in_src(pkg, path):
    rel = _rel(path)
    bad = [
        v
        for v in global_switches(path.read_text())
        if f"{rel}:{v.split('NAME=')[-1].split(' ')[0]}" not in MUTABLE_ALLOWED
    ]
    assert not bad, (
        f"{rel}: "
        + "; ".join(bad)
        + (
            " (settings are arguments, state belongs to an object the caller owns; a cache that must"
            " stay goes in MUTABLE_ALLOWED with its reason)"
        )
    )


def test_allowed_mutables_exist():
    for key in MUTABLE_ALLOWED:
        rel, name = key.split(":")
        path = ROOT / rel
        assert path.exists(), f"MUTABLE_ALLOWED names a missing file: {rel}"
        assert f"NAME={name} " in " ".join(global_switches(path.read_text())) + " ", (
            f"MUTABLE_ALLOWED names {key}, no longer a module-level mutable: drop the entry"
        )


@pytest.mark.parametrize("path", [pytest.param(f, id=_rel(f)) for f in _tests_and_benchmarks()])
def test_no_test_flips_a_module_setting(path):
    bad = switch_patches(path.read_text())
    assert not bad, (
        f"{_rel(path)}: "
        + "; ".join(bad)
        + (" (pass the setting as an argument or to the object that owns it)")
    )


@pytest.mark.parametrize("pkg,path", [pytest.param(p, f, id=_rel(f)) for p, f in _sources()])
def test_no_oversized_source_without_a_reason(pkg, path):
    source = path.read_text()
    why = oversize(source)
    assert why != "", (
        f"{_rel(path)} has {len(source.splitlines())} lines (limit {MAX_LINES}): split it by"
        " concern, or say why at the top of its module docstring in a line starting 'Size:'"
    )


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "nox -s tests" in readme and "nox -s tests" in ci


# ---- each checker can fail ----


@pytest.mark.parametrize(
    "snippet,owner,expected",
    [
        pytest.param(
            "from sparse_kernels.estimate.triton import fold", "sparse_patterns", 1, id="triton"
        ),
        pytest.param("from sparse_kernels._triton import a, b", None, 1, id="private-module"),
        pytest.param("import sparse_kernels._triton.launch", "vlm_accel", 1, id="import-private"),
        pytest.param(
            "from sparse_kernels.permuted.grid_triton import f", "sparse_patterns", 1, id="x_triton"
        ),
        pytest.param(
            "from sparse_kernels.estimate import _fold_partials, ok, triton",
            "sparse_patterns",
            2,
            id="private-name",
        ),
        pytest.param("from sparse_kernels._triton import launch", "sparse_kernels", 0, id="own"),
        pytest.param("from ._triton import launch", "sparse_patterns", 0, id="relative"),
        pytest.param("from sparse_kernels import attention, __version__", None, 0, id="public"),
        pytest.param("from triton import _private", None, 0, id="not-ours"),
    ],
)
def test_private_import_checker(snippet, owner, expected):
    assert len(private_imports(snippet, owner)) == expected


@pytest.mark.parametrize(
    "snippet,expected",
    [
        pytest.param("X = 1\ndef f():\n    global X\n    X = 2\n", ["3: global X"], id="global"),
        pytest.param("_CACHE = {}\n", ["1: NAME=_CACHE is a mutable container"], id="dict"),
        pytest.param("L: list = []\n", ["1: NAME=L is a mutable container"], id="ann-list"),
        pytest.param("S = set()\n", ["1: NAME=S is a mutable container"], id="set-call"),
        pytest.param(
            "import collections\nD = collections.defaultdict(list)\n",
            ["2: NAME=D is a mutable container"],
            id="defaultdict",
        ),
        pytest.param(
            "from contextvars import ContextVar\nV = ContextVar('v')\n",
            ["2: NAME=V is a mutable container"],
            id="contextvar",
        ),
        pytest.param(
            "try:\n    import x\nexcept ImportError:\n    T = [1]\n",
            ["4: NAME=T is a mutable container"],
            id="in-try",
        ),
        pytest.param(
            "class C:\n    seen = {}\n", ["2: NAME=seen is a mutable container"], id="class-attr"
        ),
        pytest.param(
            "import os\nDIRECT = os.environ.get('X', '1') != '0'\n",
            ["2: reads the environment at import"],
            id="env-at-import",
        ),
        pytest.param(
            "import os\nclass C:\n    on = os.getenv('X')\n",
            ["3: reads the environment at import"],
            id="env-in-class",
        ),
        pytest.param("import os\ndef f():\n    return os.environ.get('X')\n", [], id="env-in-call"),
        pytest.param("__all__ = ['a']\nT = (1, 2)\nF = frozenset({1})\n", [], id="fine"),
        pytest.param("def f():\n    d = {}\n    return d\n", [], id="local"),
    ],
)
def test_global_switch_checker(snippet, expected):
    assert global_switches(snippet) == expected


@pytest.mark.parametrize(
    "snippet,expected",
    [
        pytest.param(
            "from sparse_kernels._triton import launch as L\n"
            "def test(monkeypatch):\n    monkeypatch.setattr(L, 'DIRECT', False)\n",
            1,
            id="module-alias",
        ),
        pytest.param(
            "import sparse_patterns.mminference as MM\n"
            "def test(monkeypatch):\n    monkeypatch.setattr(MM, '_FOLD_HEADS', 4)\n",
            1,
            id="private-upper",
        ),
        pytest.param(
            "def test(monkeypatch):\n"
            "    monkeypatch.setattr('sparse_kernels.triangle.reference.SCORE_BUDGET', 9)\n",
            1,
            id="dotted-string",
        ),
        pytest.param(
            "from sparse_patterns import estimate\n"
            "def test(monkeypatch):\n    monkeypatch.setattr(estimate.mod, 'BUDGET', 1)\n",
            1,
            id="attribute-chain",
        ),
        pytest.param(
            "from sparse_kernels import ref\n"
            "def test(monkeypatch):\n    monkeypatch.setattr(ref, 'masked_reference', f)\n",
            0,
            id="function-spy",
        ),
        pytest.param(
            "import torch\n"
            "def test(monkeypatch):\n    monkeypatch.setattr(torch.cuda, 'HAS_X', False)\n",
            0,
            id="not-ours",
        ),
    ],
)
def test_switch_patch_checker(snippet, expected):
    assert len(switch_patches(snippet)) == expected


def test_oversize_checker():
    body = "x = 1\n" * MAX_LINES
    assert oversize(body) is None
    assert oversize('"""Doc."""\n' + body) == ""
    assert oversize('"""Doc.\n\nSize: one kernel and its launcher."""\n' + body) == (
        "Size: one kernel and its launcher."
    )
