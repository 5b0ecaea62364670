"""Every tuned kernel launches a looked-up config: its SPEC, its launcher's lookup key, and the
per-config timing the tuner uses."""

import importlib
import inspect
import pkgutil

import pytest
import sparse_kernels
import torch
from sparse_kernels._triton import config as C
from sparse_kernels.tuning import KernelSpec, LaunchConfig
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import KernelInterface

# The kernel modules whose launch configs are tuned, and the name of each in the tables.
TUNED = {
    "sparse_kernels.attention.triton": "attention",
    "sparse_kernels.block_sparse.triton": "block_sparse",
    "sparse_kernels.estimate.triton": "line_scores",
    "sparse_kernels.permuted.triton": "permuted",
    "sparse_kernels.triangle.triton": "triangle",
    "sparse_kernels.vertical_slash.triton": "vertical_slash",
}
# Kernel modules with tile constexprs that are set from the problem, not tuned (with why).
FIXED_TILES = {
    "sparse_kernels.grid_index.search_triton": "one program per head over a period-wide fold: "
    "its tiles follow the period (_search_setup), a few microseconds per layer",
    "sparse_kernels.triangle.sink_merge_triton": "the FA4 triangle engine's sink pass: one read "
    "of q and of the window's result per row tile over a few sink keys, memory-bound; one "
    "config per dtype, timed only inside that engine (docs/results.md)",
}
# Constexpr parameters that are a tile choice (rows, keys, or offset blocks per program): a kernel
# taking one is launched with a config, which must come from a SPEC.
TILE_PARAMS = {"BLOCK_M", "TILE_M", "OB_PER"}
# Block sizes the planners launch with (sparse_patterns: 64; FlexAttention's default: 128).
PLANNER_BLOCKS = [(64, 64), (128, 128), (128, 64), (64, 128)]


def _modules():
    for info in pkgutil.walk_packages(sparse_kernels.__path__, "sparse_kernels."):
        if info.name.endswith("__main__"):
            continue
        yield importlib.import_module(info.name)


def _kernels(mod):
    """The module's own ``@triton.jit`` functions (compiled or, under TRITON_INTERPRET=1,
    interpreted), by name."""
    return {
        name: obj
        for name, obj in vars(mod).items()
        if isinstance(obj, KernelInterface)
        and not isinstance(obj, Autotuner)
        and getattr(obj.fn, "__module__", None) == mod.__name__
    }


def _constexprs(kernel) -> set[str]:
    params = inspect.signature(kernel.fn).parameters.values()
    return {p.name for p in params if "constexpr" in str(p.annotation)}


def test_no_autotuner_remains():
    # Found by type: a new triton.autotune anywhere in the package fails here.
    found = [
        f"{mod.__name__}.{name}"
        for mod in _modules()
        for name, obj in vars(mod).items()
        if isinstance(obj, Autotuner)
    ]
    assert found == []


def test_every_kernel_with_tile_constexprs_has_a_spec():
    with_tiles = {
        mod.__name__
        for mod in _modules()
        if any(
            name.endswith("_kernel") and _constexprs(k) & TILE_PARAMS
            for name, k in _kernels(mod).items()
        )
    }
    assert with_tiles == set(TUNED) | set(FIXED_TILES)
    for name, op in TUNED.items():
        spec = importlib.import_module(name).SPEC
        assert isinstance(spec, KernelSpec) and spec.name == op


@pytest.mark.parametrize("mod_name", sorted(TUNED))
def test_spec_candidates_are_sane(mod_name):
    mod = importlib.import_module(mod_name)
    spec = mod.SPEC
    assert spec.candidates and len(set(spec.candidates)) == len(spec.candidates)
    # Every tile a config sets is a constexpr of one of the module's kernels, and all configs of a
    # spec set the same tiles, apart from TMA=1 (copy-engine loads, a tuned choice of the triangle).
    params = set().union(*(_constexprs(k) for k in _kernels(mod).values()))
    names = {
        tuple(k for k, _ in c.tiles if k != "TMA") for c in (*spec.candidates, spec.interpreter)
    }
    assert len(names) == 1 and set(next(iter(names))) <= params, names
    for c in spec.candidates:
        if "TMA" in dict(c.tiles):
            assert dict(c.tiles)["TMA"] == 1 and "TMA" in params, c
    for c in (*spec.candidates, spec.interpreter, spec.fp32):
        for value in (*(v for _, v in c.tiles), c.num_warps):
            assert value > 0 and value & (value - 1) == 0, f"{c}: not a power of two"
        assert 1 <= c.num_stages <= 4 and c.num_warps <= 8, c
    for blocks in PLANNER_BLOCKS:
        # The planners' blocks get a fitting candidate, and the safe config fits too.
        assert spec.fitting(blocks), f"{spec.name}: no candidate fits {blocks}"
        assert spec.fits(spec.safe(blocks), blocks)


@pytest.mark.parametrize(
    "mod_name, fp32",
    [
        ("attention", LaunchConfig.of(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1)),
        ("block_sparse", LaunchConfig.of(TILE_M=64, TILE_N=64, num_warps=4, num_stages=1)),
        ("estimate", LaunchConfig.of(OB_PER=4, num_warps=4, num_stages=1)),
        ("permuted", LaunchConfig.of(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1)),
        ("triangle", LaunchConfig.of(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1)),
        ("vertical_slash", LaunchConfig.of(num_warps=4, num_stages=2)),
    ],
)
def test_fp32_configs_are_one_small_tile(mod_name, fp32):
    # fp32 takes exact (ieee) dots: one small config, never looked up (large tiles take minutes
    # to compile and overflow shared memory).
    spec = importlib.import_module(f"sparse_kernels.{mod_name}.triton").SPEC
    assert spec.fp32 == fp32


def test_block_sparse_tiles_divide_the_mask_blocks():
    from sparse_kernels.block_sparse.triton import SPEC

    assert {(c["TILE_M"], c["TILE_N"]) for c in SPEC.fitting((128, 64))} == {(128, 64), (64, 64)}
    assert {(c["TILE_M"], c["TILE_N"]) for c in SPEC.fitting((64, 64))} == {(64, 64)}
    for blocks in PLANNER_BLOCKS:
        for c in [*SPEC.fitting(blocks), SPEC.safe(blocks)]:
            assert blocks[0] % c["TILE_M"] == 0 and blocks[1] % c["TILE_N"] == 0, (blocks, c)
    safe = SPEC.safe((128, 128))
    assert (safe["TILE_M"], safe["TILE_N"], safe.num_stages) == (64, 64, 3)


def _triton_runs() -> bool:
    from sparse_kernels._validate import interpreter_enabled

    return interpreter_enabled() or torch.cuda.is_available()


@pytest.mark.skipif(not _triton_runs(), reason="needs the Triton interpreter or a CUDA GPU")
def test_launchers_look_up_their_key(monkeypatch):
    """Each launcher asks ``choose_config`` for its own SPEC with the call's head dim, dtype, GQA
    group, key length, variant and blocks (the key a tuning run writes): a spy on every
    module's ``choose_config`` records what each op asks for while it runs once."""
    from sparse_kernels import (
        SparsePlan,
        attention,
        block_sparse_attention,
        line_scores,
        permuted_block_sparse_attention,
        triangle_attention,
        vertical_slash_attention,
    )
    from sparse_kernels.testing import default_device, make_qkv
    from torch.nn.attention.flex_attention import create_block_mask

    dev = default_device()
    S, D = 192, 32
    dtype = torch.float32 if dev.type == "cpu" else torch.float16
    q, k, v = make_qkv(1, 4, 2, S, S, D, dtype=dtype, device=dev, seed=3)
    nb = S // 64
    idx = torch.arange(nb, dtype=torch.int32, device=dev).expand(1, 4, nb, nb).contiguous()
    cnt = torch.arange(1, nb + 1, dtype=torch.int32, device=dev).expand(1, 4, nb).contiguous()
    plan = SparsePlan(kv_indices=idx, kv_num_blocks=cnt, block_size=64, seq_lengths=(S, S))
    bm = create_block_mask(
        lambda b, h, i, j: i >= j, None, None, S, S, device=dev.type, BLOCK_SIZE=(128, 64)
    )
    one = torch.tensor([[[0]]], dtype=torch.int32, device=dev).expand(1, 4, 1).contiguous()
    common = dict(head_dim=D, dtype=dtype, group=2, seq_len=S)
    calls = {
        "attention": (
            lambda: attention(q, k, v, causal=False, impl="triton"),
            dict(variant="full", blocks=()),
        ),
        "triangle": (
            lambda: triangle_attention(q, k, v, sink=4, window=16, last=8, impl="triton"),
            dict(variant="narrow", blocks=()),
        ),
        "block_sparse": (
            lambda: block_sparse_attention(q, k, v, bm, impl="triton"),
            dict(variant="causal", blocks=(128, 64)),
        ),
        "permuted": (
            lambda: permuted_block_sparse_attention(q, k, v, plan, impl="triton"),
            dict(variant="causal-64x64", blocks=(64, 64)),
        ),
        "vertical_slash": (
            lambda: vertical_slash_attention(
                q, k, v, one, one, block_m=128, block_n=64, impl="triton"
            ),
            dict(variant="128x64", blocks=(128, 64)),
        ),
        "estimate": (
            lambda: line_scores(q[:, :, -20:], k, S - 20, impl="triton"),
            dict(variant="rows32", blocks=()),
        ),
    }
    for mod_name, (call, want) in calls.items():
        mod = importlib.import_module(f"sparse_kernels.{mod_name}.triton")
        seen = []
        real = mod.choose_config

        def spy(spec, *, device, real=real, seen=seen, **kw):
            seen.append((spec.name, {"variant": "", "blocks": (), **kw}))  # the defaults
            return real(spec, device=device, **kw)

        monkeypatch.setattr(mod, "choose_config", spy)
        call()
        kw = {**common, **want}
        assert seen == [(mod.SPEC.name, kw)], f"{mod_name}: looked up {seen}"


def test_triangle_window_classes():
    """Windows up to NARROW_WINDOW keys look up the "narrow" entries, longer ones the others; the
    tuner's triangle shapes fall one in each class."""
    from sparse_kernels.triangle.window import NARROW_WINDOW, window_class
    from sparse_kernels.tuning.cases import TRIANGLE_SHAPES

    assert window_class(1) == window_class(NARROW_WINDOW) == "narrow"
    assert window_class(NARROW_WINDOW + 1) == "wide"
    assert {v: window_class(w) for v, (_, w, _) in TRIANGLE_SHAPES.items()} == {
        "wide": "wide",
        "narrow": "narrow",
    }


@pytest.mark.parametrize(
    "one_call_ms, quantiles, calls, want",
    [
        (16000.0, (0.5, 0.2, 0.8), 2, [16000.0] * 3),  # a 1M-token call: timed once, not 8 times
        (25.0, None, 2, 25.0),
        (0.5, (0.5, 0.2, 0.8), 2 + 8, [0.4, 0.3, 0.6]),  # short: Triton's repeated benchmark
    ],
)
def test_bench_config_times_long_configs_once(monkeypatch, one_call_ms, quantiles, calls, want):
    n = {"calls": 0}

    def kernel_call():
        n["calls"] += 1

    def time_one(fn):
        fn()
        return one_call_ms

    def triton_bench(fn, q):
        for _ in range(8):  # what triton.testing.do_bench does at the least
            fn()
        return [0.4, 0.3, 0.6]

    monkeypatch.setattr(C, "_time_one_call", time_one)
    monkeypatch.setattr(C, "_triton_bench", triton_bench)
    assert C.bench_config(kernel_call, quantiles) == want
    assert n["calls"] == calls


def test_single_quantile_is_a_float_like_triton(monkeypatch):
    monkeypatch.setattr(C, "_time_one_call", lambda fn: 50.0)
    assert C.bench_config(lambda: None, (0.5,)) == 50.0
