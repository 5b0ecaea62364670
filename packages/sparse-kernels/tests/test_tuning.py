"""Launch-config lookup: tables, the lookup order, the safe config and its hint, CompileLog."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import triton
from sparse_kernels.tuning import (
    CompileLog,
    ConfigChooser,
    ConfigTable,
    KernelSpec,
    LaunchConfig,
    TableEntry,
    family_of,
    length_bucket,
    shipped_table_path,
    user_table_path,
)

BIG = LaunchConfig.of(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
MID = LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
SMALL = LaunchConfig.of(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
SPEC = KernelSpec(
    name="toy",
    candidates=(BIG, MID, SMALL),
    interpreter=LaunchConfig.of(BLOCK_M=16, BLOCK_N=16),
    fp32=LaunchConfig.of(BLOCK_M=64, BLOCK_N=32),
    fits=lambda c, blocks: not blocks or (c["BLOCK_M"] <= blocks[0] and c["BLOCK_N"] <= blocks[1]),
)
K128 = 131072


def entry(config, *, variant="causal", head_dim=128, dtype="bfloat16", group=7, seq_len=K128):
    return TableEntry("toy", variant, head_dim, dtype, group, length_bucket(seq_len), config,
                      seq_len=seq_len, ms=1.0)  # fmt: skip


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_KERNELS_CACHE_DIR", str(tmp_path))
    return tmp_path


def write_user(entries, family="testgpu"):
    ConfigTable(family, gpu="Test GPU", entries=tuple(entries)).save(user_table_path(family))


def lookup(chooser, **kw):
    args = dict(family="testgpu", head_dim=128, dtype=torch.bfloat16, group=7, seq_len=K128,
                variant="causal")  # fmt: skip
    return chooser.lookup(SPEC, **{**args, **kw})


def test_length_buckets_are_factors_of_four():
    assert [length_bucket(n) for n in (32768, 32769, 131072, 131073, 524288, 1 << 20)] == [
        7, 8, 8, 9, 9, 10,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "name, family",
    [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
     ("Tesla T4", "tesla-t4")],
)  # fmt: skip
def test_gpu_family_of_device_names(name, family):
    assert family_of(name) == family


def test_launch_config_json_round_trip_and_errors():
    assert LaunchConfig.from_json(BIG.to_json()) == BIG
    assert BIG["BLOCK_N"] == 128 and BIG.launch_kwargs()["num_warps"] == 8
    with pytest.raises(ValueError, match=r"num_stages: expected a positive int, got 0"):
        LaunchConfig.from_json({"BLOCK_M": 64, "num_warps": 4, "num_stages": 0})
    with pytest.raises(ValueError, match=r"expected key 'num_warps'"):
        LaunchConfig.from_json({"BLOCK_M": 64, "num_stages": 1})
    with pytest.raises(KeyError, match="TILE_M"):
        BIG["TILE_M"]


def test_table_round_trip_merge_and_errors(tmp_path):
    t = ConfigTable("testgpu", gpu="Test GPU", versions={"triton": "3.6.0"}, entries=(entry(BIG),))
    path = tmp_path / "t.json"
    t.save(path)
    assert ConfigTable.load(path) == t
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary left behind
    merged = t.merged([entry(SMALL), entry(MID, seq_len=32768)])
    assert sorted((e.bucket, e.config) for e in merged.entries) == [(7, MID), (8, SMALL)]
    bad = t.to_json()
    bad["entries"][0]["head_dim"] = "128"
    with pytest.raises(ValueError, match=r"entries\[0\]\.head_dim: expected int, got str"):
        ConfigTable.from_json(bad)
    with pytest.raises(ValueError, match="expected format 1, got 2"):
        ConfigTable.from_json({**t.to_json(), "format": 2})
    bad = t.to_json()
    bad["entries"][0]["dtype"] = "fp8"
    with pytest.raises(ValueError, match=r"dtype: expected one of .*got 'fp8'"):
        ConfigTable.from_json(bad)
    path.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        ConfigTable.load(path)


def test_user_entry_with_the_exact_key_wins(cache):
    write_user([entry(MID), entry(BIG, seq_len=32768)])
    got = lookup(ConfigChooser())
    assert (got.source, got.config) == ("user", MID)


def test_nearest_prefers_variant_then_dtype_then_bucket_then_group(cache):
    write_user([
        entry(BIG, variant="full"),
        entry(MID, dtype="float16", seq_len=32768),
        entry(SMALL, seq_len=32768, group=6),
    ])  # fmt: skip
    chooser = ConfigChooser()
    # same variant and dtype, one bucket away: SMALL
    assert lookup(chooser, seq_len=524288).config == SMALL
    # a float16 call: the float16 entry of the same variant
    assert lookup(chooser, dtype=torch.float16).config == MID
    # an unknown variant: the closest bucket among all, the 128K "full" one
    got = lookup(chooser, variant="other")
    assert (got.source, got.config) == ("nearest", BIG)


def test_entries_that_do_not_fit_the_blocks_are_skipped(cache):
    write_user([entry(BIG), entry(SMALL, seq_len=32768)])
    got = lookup(ConfigChooser(), blocks=(64, 64))
    assert (got.source, got.config) == ("nearest", SMALL)


def test_an_untuned_gpu_gets_the_safe_config_and_one_hint(cache, caplog):
    chooser = ConfigChooser()
    with caplog.at_level(logging.WARNING, logger="sparse_kernels.tuning"):
        first = lookup(chooser, family="unknown-gpu")
        again = lookup(chooser, family="unknown-gpu", seq_len=32768)
    assert (first.source, first.config) == ("safe", SMALL)  # least tile area x stages
    assert again.config == SMALL
    hints = [r for r in caplog.records if r.name == "sparse_kernels.tuning"]
    assert len(hints) == 1
    assert "python -m sparse_kernels tune" in hints[0].getMessage()
    assert "'unknown-gpu'" in hints[0].getMessage()


def test_safe_config_uses_the_fallback_when_nothing_fits():
    spec = KernelSpec("toy", (BIG,), BIG, fits=SPEC.fits,
                      fallback=lambda b: LaunchConfig.of(BLOCK_M=b[0], BLOCK_N=b[1]))  # fmt: skip
    assert spec.safe((32, 16)) == LaunchConfig.of(BLOCK_M=32, BLOCK_N=16)
    with pytest.raises(ValueError, match=r"no launch config fits blocks \(32, 16\)"):
        KernelSpec("toy", (BIG,), BIG, fits=SPEC.fits).safe((32, 16))


def test_reload_reads_a_table_written_after_the_first_lookup(cache):
    chooser = ConfigChooser()
    assert lookup(chooser).source == "safe"
    write_user([entry(MID)])
    assert lookup(chooser).source == "safe"  # loaded once per family
    chooser.reload()
    assert lookup(chooser).source == "user"


def test_choose_off_the_gpu_is_the_interpreter_config():
    got = ConfigChooser().choose(SPEC, device=torch.device("cpu"), head_dim=128,
                                 dtype=torch.float16, group=1, seq_len=1024)  # fmt: skip
    assert (got.source, got.config) == ("interpreter", SPEC.interpreter)


def test_user_table_path_follows_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARSE_KERNELS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert user_table_path("h100") == tmp_path / "sparse-kernels" / "tuned-h100.json"


def test_compile_log_counts_variants_calls_back_and_restores_the_hooks():
    rt = triton.knobs.runtime
    seen = []

    def outer_before(**kw):
        seen.append(("outer", kw["key"]))
        return False

    rt.jit_cache_hook, rt.jit_post_compile_hook = outer_before, None
    try:
        names = []
        with CompileLog(on_compile=names.append) as log:
            for key, name in [(1, "_a_kernel"), (2, "_b_kernel"), (3, "_a_kernel")]:
                fn = SimpleNamespace(name=name)
                # a true value from the cache hook would make Triton skip the compile
                assert not rt.jit_cache_hook(key=key, fn=fn)
                rt.jit_post_compile_hook(key=key, fn=fn)
        assert log.count == 3 and names == ["_a_kernel", "_b_kernel", "_a_kernel"]
        assert log.by_kernel() == {"_a_kernel": 2, "_b_kernel": 1}
        assert log.seconds >= 0 and "3 kernel variants" in log.summary()
        assert seen == [("outer", 1), ("outer", 2), ("outer", 3)]  # earlier hooks still run
        assert (rt.jit_cache_hook, rt.jit_post_compile_hook) == (outer_before, None)
    finally:
        rt.jit_cache_hook = rt.jit_post_compile_hook = None


def test_a_gpu_without_tables_borrows_those_of_its_compute_capability(cache, caplog):
    h100 = ConfigTable.load(shipped_table_path("h100"))
    want = next(e for e in h100.entries if e.op == "attention" and e.bucket == 7)
    spec = KernelSpec("attention", (SMALL,), SMALL)
    args = dict(head_dim=128, dtype=torch.bfloat16, group=7, seq_len=32768, variant="causal")
    with caplog.at_level(logging.WARNING, logger="sparse_kernels.tuning"):
        got = ConfigChooser().lookup(spec, family="gh200", capability="9.0", **args)
        other = ConfigChooser().lookup(spec, family="gh200", capability="8.0", **args)
    assert (got.source, got.config) == ("borrowed", want.config)
    assert (other.source, other.config) == ("safe", SMALL)
    borrowed, safe = (r.getMessage() for r in caplog.records)
    assert "using those of h100" in borrowed
    assert "using a safe one" in safe


def test_a_variant_the_table_lacks_comes_from_its_compute_capability(cache, caplog):
    # The H200 table has no narrow-window triangle entries; the H100 table has.
    h100 = ConfigTable.load(shipped_table_path("h100"))
    h200 = ConfigTable.load(shipped_table_path("h200"))
    assert not any(e.op == "triangle" and e.variant == "narrow" for e in h200.entries)
    want = next(e for e in h100.entries if e.key == ("triangle", "narrow", 128, "bfloat16", 7, 8))
    spec = KernelSpec("triangle", (SMALL, MID, BIG), SMALL)
    args = dict(head_dim=128, dtype=torch.bfloat16, group=7, seq_len=131072)
    with caplog.at_level(logging.WARNING, logger="sparse_kernels.tuning"):
        got = ConfigChooser().lookup(
            spec, family="h200", capability="9.0", variant="narrow", **args
        )
        wide = ConfigChooser().lookup(spec, family="h200", capability="9.0", variant="wide", **args)
        alone = ConfigChooser().lookup(spec, family="h200", capability="", variant="narrow", **args)
    assert (got.source, got.config, got.entry) == ("borrowed", want.config, want)
    assert wide.source == "shipped" and wide.entry.variant == "wide"
    assert alone.source == "nearest" and alone.entry.variant == "wide"  # no capability: its own
    assert "using the 'narrow' entries of h100" in caplog.records[0].getMessage()


@pytest.mark.parametrize("family", ["h100", "h200"])
def test_the_shipped_table_is_chosen_on_its_gpu(family, cache):
    table = ConfigTable.load(shipped_table_path(family))
    assert table.family == family and table.capability == "9.0"
    assert {e.op for e in table.entries} == {
        "attention", "block_sparse", "line_scores", "permuted", "triangle", "vertical_slash",
    }  # fmt: skip
    for e in table.entries:
        spec = KernelSpec(e.op, (e.config,), e.config)
        got = ConfigChooser().lookup(
            spec, family=family, head_dim=e.head_dim, dtype=getattr(torch, e.dtype),
            group=e.group, seq_len=e.seq_len, variant=e.variant,
        )  # fmt: skip
        assert (got.source, got.entry) == ("shipped", e)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("op", "kernels"),
    [("triangle", {"_triangle_fwd_kernel", "_triangle_merge_kernel"}),
     ("permuted", {"_permuted_fwd_kernel"})],
)  # fmt: skip
def test_a_longer_prompt_reuses_the_compiled_kernel(op, kernels):
    # 8K and 32K keys take the same config (one length bucket apart, the same table entry or
    # safe config) but other chunk counts / list widths (8 vs 32 triangle chunks): arguments the
    # kernels are not specialized on, so the second length compiles nothing.
    from sparse_kernels.tuning.cases import CASES, TuneShape

    shape = TuneShape(28, 4, 128, "bfloat16")
    dev = torch.device("cuda")
    # One call per tuned variant (permuted: 64x64 and 128x128 blocks), each against its own.
    firsts = CASES[op].prepare(shape, 8192, dev)
    for first in firsts:
        first.run(None)
    seconds = CASES[op].prepare(shape, 32768, dev)
    assert [p.variant for p in seconds] == [p.variant for p in firsts]
    with CompileLog() as log:
        for second in seconds:
            second.run(None)
        torch.cuda.synchronize()
    assert not kernels & set(log.by_kernel()), log.by_kernel()
