"""The tuning run: keys the launchers look up, skip/force, the neighbour-bucket rule, atomic and
merged writes, failing candidates, and `python -m sparse_kernels tune`'s flags. Timing and
candidates are injected (no kernel runs), so this is CPU-only and fast."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
import triton
from sparse_kernels.__main__ import main as sk_main
from sparse_kernels.__main__ import parse_lengths
from sparse_kernels.tuning import (
    OPS,
    ConfigTable,
    LaunchConfig,
    TableEntry,
    TuneShape,
    length_bucket,
    tune,
    user_table_path,
)
from sparse_kernels.tuning import cases as tc
from sparse_kernels.tuning.lookup import CHOOSER
from sparse_kernels.tuning.tuner import NEIGHBOUR_SLACK, pick

SHAPE = TuneShape(4, 2, 32, "float16")
FAMILY = "cpu-triton-interpreter"  # family_of the name tune gives a CPU device
A = LaunchConfig.of(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
B = LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
C = LaunchConfig.of(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
KERNEL_MODULES = {
    "attention": "sparse_kernels.attention.triton",
    "block_sparse": "sparse_kernels.block_sparse.triton",
    "permuted": "sparse_kernels.permuted.triton",
    "triangle": "sparse_kernels.triangle.triton",
    "vertical_slash": "sparse_kernels.vertical_slash.triton",
    "line_scores": "sparse_kernels.estimate.triton",
}
# The variants each op is tuned for, in the order its case prepares them: the table variants its
# launcher looks up in a prefill (vertical_slash and permuted: the planner's 64x64 blocks and
# 128x128 ones).
VARIANTS = {
    "attention": ["causal"],
    "block_sparse": ["causal"],
    "permuted": ["causal-64x64", "causal-128x128"],
    "triangle": ["wide", "narrow"],
    "vertical_slash": ["64x64", "128x128"],
    "line_scores": ["rows64"],
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_KERNELS_CACHE_DIR", str(tmp_path))
    CHOOSER.reload()
    yield tmp_path
    CHOOSER.reload()


class Timer:
    """Fake timer: ms per config (per length when given a dict of dicts); records each call."""

    def __init__(self, ms):
        self.ms, self.calls = ms, []

    def __call__(self, call):
        config = call.args[0]
        self.calls.append(config)
        ms = self.ms[config]
        if isinstance(ms, BaseException):
            raise ms
        return ms


def run(lengths, timer, *, ops=("attention",), cands=(A, B, C), **kw):
    return tune(SHAPE, lengths, ops=ops, device="cpu", timer=timer,
                candidates={op: cands for op in ops}, log=lambda line: None, **kw)  # fmt: skip


class _Asked(Exception):
    pass


def launcher_key(monkeypatch, op, prepared):
    """The lookup arguments the op's launcher passes to choose_config on the case's inputs."""
    mod = importlib.import_module(KERNEL_MODULES[op])
    if not hasattr(mod, "SPEC"):
        pytest.skip(f"{op}: its launcher does not look configs up yet")

    def ask(spec, **kw):
        raise _Asked(spec, kw)

    monkeypatch.setattr(mod, "choose_config", ask)
    with pytest.raises(_Asked) as got:
        prepared.run(None)
    return got.value.args


@pytest.mark.parametrize("op", OPS)
def test_tuned_entry_has_the_key_its_launcher_looks_up(cache, monkeypatch, op):
    S = 512
    # line_scores launches its first pass before it looks pass 2's config up: on a GPU machine
    # (no interpreter) that launch needs CUDA tensors
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    calls = tc.CASES[op].prepare(SHAPE, S, dev)
    asked = [launcher_key(monkeypatch, op, prepared) for prepared in calls]
    assert [kw.get("variant", "") for _, kw in asked] == VARIANTS[op]
    spec = asked[0][0]
    fit = [c for c in spec.candidates if all(spec.fits(c, kw.get("blocks", ())) for _, kw in asked)]
    cands = fit[:2]
    res = run([S], Timer({c: 1.0 + i for i, c in enumerate(cands)}), ops=[op], cands=cands)
    assert res.path == user_table_path(FAMILY) and len(res.tuned) == len(calls)
    for _, kw in asked:
        assert kw["seq_len"] == S and kw["group"] == SHAPE.group
        got = CHOOSER.lookup(spec, family=FAMILY, **{k: v for k, v in kw.items() if k != "device"})
        # "user" only for the exact key: another variant's entry would come back as "nearest"
        assert got.source == "user" and got.config == cands[0]
        assert got.entry.variant == kw.get("variant", "")


def test_one_vertical_slash_run_tunes_64x64_and_128x128_tiles_as_two_entries(cache):
    w4, w8 = LaunchConfig.of(num_warps=4, num_stages=2), LaunchConfig.of(num_warps=8, num_stages=3)
    timer, lines = Timer({w4: 2.0, w8: 1.0}), []
    res = tune(SHAPE, [512, 4096], ops=["vertical_slash"], device="cpu", timer=timer,
               candidates={"vertical_slash": (w4, w8)}, log=lines.append)  # fmt: skip
    want = [("64x64", 512), ("128x128", 512), ("64x64", 4096), ("128x128", 4096)]
    assert [(e.variant, e.seq_len) for e in res.tuned] == want
    table = ConfigTable.load(user_table_path(FAMILY))
    assert sorted((e.op, e.variant, e.bucket, e.config) for e in table.entries) == sorted(
        ("vertical_slash", v, length_bucket(S), w8) for v, S in want
    )
    assert timer.calls == [w4, w8] * 4  # every variant timed every candidate at each length
    assert [line.split(" D=")[0] for line in lines] == [f"tune vertical_slash/{v}" for v, _ in want]


def test_a_case_that_prepares_no_tuple_is_refused_before_any_timing(cache):
    attention = tc.CASES["attention"]
    bare = tc.TuneCase("attention", attention.spec, lambda *a: attention.prepare(*a)[0])
    timer = Timer({A: 1.0, B: 2.0, C: 3.0})
    with pytest.raises(TypeError, match="expected a non-empty tuple of Prepared, got Prepared"):
        run([256], timer, cases={"attention": bare})
    assert timer.calls == []


def test_keys_in_the_table_are_skipped_and_force_tunes_them_again(cache):
    first = run([256, 1024], Timer({A: 1.0, B: 2.0, C: 3.0}))
    assert len(first.tuned) == 2 and not first.skipped
    again = Timer({A: 5.0, B: 1.0, C: 3.0})
    second = run([256, 1024], again)
    assert again.calls == [] and not second.tuned and len(second.skipped) == 2
    assert {e.config for e in ConfigTable.load(first.path).entries} == {A}
    forced = run([1024], again, force=True)
    assert len(forced.tuned) == 1 and again.calls == [A, B, C]
    by_bucket = {e.bucket: e.config for e in ConfigTable.load(first.path).entries}
    assert by_bucket == {length_bucket(256): A, length_bucket(1024): B}


@pytest.mark.parametrize(
    ("b_ms", "want"), [(0.98, A), (0.96, B)], ids=["B-2%-faster-keeps-A", "B-4%-faster-takes-B"]
)
def test_neighbour_bucket_config_kept_within_three_percent(cache, b_ms, want):
    times = {A: 1.0, B: 2.0, C: 3.0}
    run([256], Timer(times))  # bucket 4: A
    res = run([1024], Timer({A: 1.0, B: b_ms, C: 3.0}))
    (entry,) = res.tuned
    assert entry.config == want and entry.bucket == length_bucket(1024)


def test_pick_prefers_the_nearest_buckets_config_only_within_the_slack():
    assert pick({A: 1.0, B: 1.02}, [B]) == B
    assert pick({A: 1.0, B: NEIGHBOUR_SLACK + 0.01}, [B]) == A
    assert pick({A: 1.0, B: 1.02}, [C]) == A  # the neighbour's config did not run here
    with pytest.raises(ValueError, match="at least one timed config"):
        pick({}, [A])


def test_merge_keeps_other_entries_and_writes_elsewhere_with_out(cache, tmp_path):
    out = tmp_path / "shipped" / "t.json"
    other = TableEntry("triangle", "", 128, "bfloat16", 7, 8, C, seq_len=131072, ms=2.0)
    ConfigTable(FAMILY, entries=(other,), command="earlier").save(out)
    res = run([256], Timer({A: 1.0, B: 2.0, C: 3.0}), out=out, command="now")
    table = ConfigTable.load(out)
    assert res.path == out and not user_table_path(FAMILY).exists()
    assert {e.op for e in table.entries} == {"attention", "triangle"}
    assert table.command == "earlier ; now" and table.family == FAMILY


def test_a_failed_run_leaves_the_table_as_it_was_and_no_temporary_file(cache):
    run([256], Timer({A: 1.0, B: 2.0, C: 3.0}))
    path = user_table_path(FAMILY)
    before = path.read_text()
    with pytest.raises(KeyError):
        run([1024], Timer({A: 1.0}))  # the timer fails on B: an error that is not skipped
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    json.loads(before)


def test_each_finished_op_is_saved_before_the_next_one_runs(cache):
    class FailsOnBlockSparse(Timer):
        def __call__(self, call):
            if call.func.__qualname__.startswith("_block_sparse"):
                raise KeyboardInterrupt  # the run is stopped during the second op
            return super().__call__(call)

    with pytest.raises(KeyboardInterrupt):
        run([256], FailsOnBlockSparse({A: 1.0, B: 2.0, C: 3.0}), ops=("attention", "block_sparse"))
    assert [e.op for e in ConfigTable.load(user_table_path(FAMILY)).entries] == ["attention"]


def test_out_of_resources_candidates_are_skipped_and_reported(cache):
    oor = triton.runtime.errors.OutOfResources(232448, 101376, "shared memory")
    res = run([256], Timer({A: 2.0, B: oor, C: 1.5}))
    assert [e.config for e in res.tuned] == [C]
    assert [(f.config, f.error.split(":")[0]) for f in res.failures] == [(B, "OutOfResources")]
    with pytest.raises(RuntimeError, match="no candidate ran"):
        run([1024], Timer({A: oor, B: oor, C: oor}))


def test_a_table_of_another_gpu_family_is_refused_before_any_timing(cache, tmp_path):
    out = tmp_path / "h100.json"
    ConfigTable("h100").save(out)
    timer = Timer({A: 1.0, B: 2.0, C: 3.0})
    with pytest.raises(ValueError, match="expected a table for GPU family"):
        run([256], timer, out=out)
    assert timer.calls == []


def test_progress_is_one_line_per_key(cache):
    lines = []
    tune(SHAPE, [256, 1024], ops=["attention"], device="cpu", timer=Timer({A: 1.0, B: 2.0}),
         candidates={"attention": (A, B)}, log=lines.append)  # fmt: skip
    assert len(lines) == 2 and all(line.startswith("tune attention/causal D=32") for line in lines)


@pytest.mark.parametrize(
    ("kw", "err"),
    [
        (dict(lengths=[]), "at least one key length"),
        (dict(lengths=[0]), r"ints in \[1, 2\*\*31\)"),
        (dict(lengths=[256], ops=["nope"]), "expected names from attention"),
    ],
)
def test_bad_arguments_name_expected_and_received(cache, kw, err):
    with pytest.raises(ValueError, match=err):
        tune(SHAPE, device="cpu", timer=Timer({}), log=lambda line: None,
             **{"ops": ["attention"], **kw})  # fmt: skip


def test_tune_shape_checks():
    with pytest.raises(ValueError, match="heads divisible by kv_heads"):
        TuneShape(28, 5, 128)
    with pytest.raises(ValueError, match="dtype: expected one of"):
        TuneShape(28, 4, 128, "int8")


def test_parse_lengths():
    assert parse_lengths("32K,128k,1M,100") == [32768, 131072, 1 << 20, 100]


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["tune", "--lengths", "32K"], "missing --heads, --kv-heads, --head-dim"),
        (["tune", "--preset", "gpt", "--lengths", "32K"], "got 'gpt'"),
        (["tune", "--preset", "qwen2-vl-2b", "--lengths", "32Q"], "got '32Q'"),
        (["tune", "--preset", "qwen2-vl-2b", "--heads", "2", "--lengths", "1K"], "got both"),
        (["tune", "--heads", "28", "--kv-heads", "5", "--head-dim", "128", "--lengths", "1K"],
         "heads=28, kv_heads=5"),
        (["tune", "--preset", "qwen2-vl-2b", "--ops", "dense", "--lengths", "1K"], "got 'dense'"),
    ],
)  # fmt: skip
def test_tune_cli_usage_errors_exit_2(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        sk_main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1


def test_tune_cli_without_cuda_exits_2_with_one_line(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sk_main(["tune", "--preset", "smollm2-135m", "--lengths", "1K"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m sparse_kernels tune: error: tuning needs a CUDA GPU; torch sees none"
    )
