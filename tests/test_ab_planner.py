"""scripts/ab_planner.py: two copies of the packages in one process, and its plan checks."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ab_planner", ROOT / "scripts" / "ab_planner.py")
ab = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = ab  # dataclasses look their module up there
_spec.loader.exec_module(ab)

PROBE = ("abprobe_kernels", "abprobe_patterns")


def _write_probe_tree(root: pathlib.Path) -> None:
    """Two packages under ``root/packages/*/src``: ``abprobe_patterns.where_lazy()`` imports
    ``abprobe_kernels.lazy`` inside the function, by absolute name, and returns its file."""
    k = root / "packages" / "k" / "src" / "abprobe_kernels"
    p = root / "packages" / "p" / "src" / "abprobe_patterns"
    k.mkdir(parents=True)
    p.mkdir(parents=True)
    (k / "__init__.py").write_text("")
    (k / "lazy.py").write_text("WHERE = __file__\n")
    (p / "__init__.py").write_text(
        "import abprobe_kernels\n\n\n"
        "def where_lazy():\n"
        "    from abprobe_kernels.lazy import WHERE\n\n"
        "    return WHERE\n"
    )


@pytest.fixture
def probe_trees(tmp_path, monkeypatch):
    """``(new, old, new_root, old_root)``: the new copy imported the ordinary way (sys.path),
    the old one loaded beside it."""
    for side in ("new", "old"):
        _write_probe_tree(tmp_path / side)
    for src in sorted((tmp_path / "new").glob("packages/*/src")):
        monkeypatch.syspath_prepend(str(src))
    try:
        new = ab.imported_tree("new", PROBE)
        old = ab.load_tree("old", tmp_path / "old", PROBE)
        yield new, old, tmp_path / "new", tmp_path / "old"
    finally:
        for name in [n for n in sys.modules if n.partition(".")[0] in PROBE]:
            del sys.modules[name]


def test_lazy_import_in_an_old_function_finds_the_old_module(probe_trees):
    new, old, new_root, old_root = probe_trees
    path_before = list(sys.path)
    assert old["abprobe_patterns"].where_lazy is not new["abprobe_patterns"].where_lazy
    assert pathlib.Path(old["abprobe_patterns"].__file__).is_relative_to(old_root)
    with old.active():
        assert sys.modules["abprobe_kernels"] is old["abprobe_kernels"]
        where = old["abprobe_patterns"].where_lazy()
    assert pathlib.Path(where).is_relative_to(old_root)
    # this tree's modules are back, and the old module imported inside the block is not left
    assert sys.modules["abprobe_patterns"] is new["abprobe_patterns"]
    assert sys.modules["abprobe_kernels"] is new["abprobe_kernels"]
    assert "abprobe_kernels.lazy" not in sys.modules
    assert sys.path == path_before
    assert pathlib.Path(new["abprobe_patterns"].where_lazy()).is_relative_to(new_root)
    # the old tree keeps the module it imported lazily, and finds it again
    kept = old["abprobe_kernels.lazy"]
    with old.active():
        old["abprobe_patterns"].where_lazy()
        assert sys.modules["abprobe_kernels.lazy"] is kept
    assert pathlib.Path(sys.modules["abprobe_kernels.lazy"].__file__).is_relative_to(new_root)


def test_load_tree_names_the_missing_package(tmp_path):
    _write_probe_tree(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"missing \['abprobe_nothere'\]"):
        ab.load_tree("old", tmp_path, ("abprobe_kernels", "abprobe_nothere"))
    assert not any(n.partition(".")[0] in PROBE for n in sys.modules)


def _plan(rows, counts, *, q_perm=None, stride=(4, 4)):
    """A plan of one batch row, two heads of one query block each: ``rows[h]`` lists head
    ``h``'s key blocks (then padding), ``counts[h]`` how many are listed."""
    return SimpleNamespace(
        kv_block_indices=torch.tensor(rows)[None, :, None],
        kv_block_counts=torch.tensor(counts)[None, :, None],
        q_perm=q_perm, kv_perm=None, meta={"stride": torch.tensor(stride)},
    )  # fmt: skip


def test_compare_plans_reads_lists_as_sets_and_finds_each_difference():
    a = _plan([[0, 1, 9], [2, 0, 7]], [2, 2])
    same = _plan([[1, 0, 5, 5], [0, 2, 6, 6]], [2, 2])  # other order, other padding
    got = ab.compare_plans(a, same)
    assert got["lists"] is True and got["stride"] is True and got["q_perm"] is True
    assert got["phase"].startswith("not compared")
    assert ab.compare_plans(a, _plan([[0, 1, 9], [2, 1, 7]], [2, 2]))["lists"] is False
    assert ab.compare_plans(a, _plan([[0, 1, 9], [2, 0, 7]], [2, 3]))["lists"] is False
    perm = _plan([[0, 1, 9], [2, 0, 7]], [2, 2], q_perm=torch.arange(4))
    assert ab.compare_plans(a, perm)["q_perm"] is False
    assert ab.compare_plans(a, _plan([[0, 1], [2, 0]], [2, 2], stride=(4, 8)))["stride"] is False
    assert ab.compare_plans(SimpleNamespace(), a)["lists"].startswith("not compared")


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--lengths", "12Q"], "--lengths", id="bad-length"),
        pytest.param(["--cases", "grid,nope"], "--cases", id="bad-case"),
        pytest.param(["--lengths", "1000"], "multiples of --tokens-per-frame", id="not-frames"),
        pytest.param(["--heads", "6", "--kv-heads", "4"], "--kv-heads", id="gqa"),
    ],
)
def test_bad_arguments_exit_2_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        ab.main(["--device", "cpu", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def _copy_of_this_tree(root: pathlib.Path) -> pathlib.Path:
    for dist in ("modality-index", "sparse-kernels", "sparse-patterns"):
        shutil.copytree(ROOT / "packages" / dist / "src", root / "packages" / dist / "src",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return root


# The script's CPU mode needs the Triton interpreter, which the root conftest sets only where no
# CUDA GPU is; on a GPU machine (gpu-tests) the same tiny case runs compiled on the GPU.
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
TINY = ["--device", DEVICE, "--dtype", "float32", "--lengths", "256", "--reps", "1", "--warmup",
        "0", "--heads", "2", "--kv-heads", "1", "--head-dim", "16", "--tokens-per-frame", "16",
        "--block", "16"]  # fmt: skip


def test_a_case_that_raises_is_recorded_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    base = _copy_of_this_tree(tmp_path / "base")
    seen = []

    def run_case(case, S, trees, shape, args):
        seen.append(case)
        raise RuntimeError(f"no {case} today")

    monkeypatch.setattr(ab, "run_case", run_case)
    out = tmp_path / "ab.json"
    argv = [*TINY, "--cases", "grid,vs", "--base", str(base), "--json", str(out)]
    assert ab.main(argv) == 1
    assert seen == ["grid", "vs"]
    rows = json.loads(out.read_text())["rows"]
    assert [r["error"] for r in rows] == [
        "RuntimeError: no grid today",
        "RuntimeError: no vs today",
    ]
    assert "checks failed: grid@256 (error), vs@256 (error)" in capsys.readouterr().err


def test_end_to_end_at_a_tiny_size_against_a_copy_of_this_tree(tmp_path):
    """The script's whole path at a tiny size, the old tree a copy of this one: distinct
    module objects, equal plans and outputs, this tree's modules in sys.modules afterwards."""
    import sparse_patterns

    old = ab.load_tree("old", _copy_of_this_tree(tmp_path), ab.PACKAGES)
    assert old["sparse_patterns"] is not sparse_patterns
    assert old["sparse_patterns"].plan_layer is not sparse_patterns.plan_layer
    assert pathlib.Path(old["sparse_patterns"].__file__).is_relative_to(tmp_path)
    assert sys.modules["sparse_patterns"] is sparse_patterns
    out = tmp_path / "ab.json"
    assert ab.main([*TINY, "--cases", "grid", "--base", str(tmp_path), "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["max_abs_diff"] == 0.0 and row["plans_equal"] and row["plan_parts"]["lists"]
    assert sys.modules["sparse_patterns"] is sparse_patterns
