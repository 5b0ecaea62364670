import json

import pytest
import torch

pytest.importorskip("transformers")
from modality_index.integrations.hf import sample_clip_path  # noqa: E402
from vlm_accel import engine  # noqa: E402
from vlm_accel.cli import main  # noqa: E402
from vlm_accel.errors import EXIT_INPUT, EXIT_OK  # noqa: E402

CLIP = str(sample_clip_path())
BASE = [
    "--model",
    "tiny",
    "--video",
    CLIP,
    "--prompt",
    "What happens?",
    "--frames",
    "4",
    "--device",
    "cpu",
]
# 24 frames at 224 x 224: 813 tokens, long enough for every method to differ from dense
# (conftest.MethodCalls.APPLIES_FROM).
LONG = [*BASE[:6], "--frames", "24", "--max-pixels", "50176", "--device", "cpu"]


def test_demo_prints_ttft_and_agreement(capsys):
    assert main(["demo", "--frames", "4", "--max-pixels", "12544"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "dense TTFT" in out and "trianglemix TTFT" in out and "next-token argmax" in out


def test_run_dense_and_trianglemix(capsys, method_calls):
    assert main(["run", *BASE, "--max-new-tokens", "3"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "TTFT" in out and "video" in out
    # no tokenizer: the ids are shown as ids, under a label that says so
    (answer,) = [line for line in out.splitlines() if line.startswith("answer")]
    label, ids = answer.split(": ")
    assert label == "answer (token ids; the tiny random model has no tokenizer)"
    assert len(ids.split()) == 3 and all(i.isdigit() for i in ids.split())
    assert method_calls.lengths == {"mminference": [], "triangle": [], "plan": []}
    argv = ["run", *LONG, "--method", "trianglemix", "--start-layer", "2", "--max-new-tokens", "2"]
    assert main([*argv, "--fused"]) == EXIT_OK
    # layers 2 and 3, in the timed prefill and in generate's prefill
    method_calls.assert_ran("triangle", calls=4)
    assert "method: trianglemix" in capsys.readouterr().out


def test_bench_writes_json_and_png(tmp_path, method_calls, monkeypatch, capsys):
    from vlm_accel import plots

    drawn = []
    real = plots.bench_figure

    def spy(rows, **kwargs):
        drawn.append(kwargs)
        return real(rows, **kwargs)

    monkeypatch.setattr(plots, "bench_figure", spy)
    stem = tmp_path / "bench"
    argv = ["bench", *LONG, "--methods", "trianglemix,dense", "--repeat", "2", "--out", str(stem)]
    assert main(argv) == EXIT_OK
    data = json.loads(stem.with_suffix(".json").read_text())
    device = f"CPU ({torch.get_num_threads()} threads)"
    assert data["device"] == device
    assert drawn == [{"device": device, "baseline": "dense"}]
    note = "note: TriangleMix from layer 2 of 4 (half the layers): no --start-layer and no probe"
    assert note in capsys.readouterr().err
    assert [r["method"] for r in data["rows"]] == ["trianglemix", "dense"]
    assert all(len(r["ttft_runs_s"]) == 2 for r in data["rows"])
    method_calls.assert_ran("triangle", calls=3 * 2)  # warm-up + 2 runs, layers 2 and 3
    assert stem.with_suffix(".png").stat().st_size > 1000


def test_search_then_show_and_run_mminference(tmp_path, capsys, method_calls):
    cfg = tmp_path / "cfg.json"
    assert main(["search", *BASE, "--out", str(cfg)]) == EXIT_OK
    assert json.loads(cfg.read_text())["num_layers"] == 4
    png = tmp_path / "pictures" / "head.png"  # missing directories are created, as for search
    assert (
        main(
            ["show", *BASE, "--config", str(cfg), "--layer", "1", "--head", "0", "--out", str(png)]
        )
        == EXIT_OK
    )
    assert png.stat().st_size > 1000
    assert sorted(p.name for p in png.parent.iterdir()) == ["head.png"]
    assert (
        main(
            ["run", *LONG, "--method", "mminference", "--config", str(cfg), "--max-new-tokens", "2"]
        )
        == EXIT_OK
    )
    method_calls.assert_ran("mminference", calls=2 * 4)  # timed and generate's prefill


def test_search_a_shape_is_exact_unless_block_rounded_is_asked(tmp_path, monkeypatch, method_calls):
    """``search`` hands ``exact_a_shape=True`` to the search by default, whose A-shape heads
    without a boundary are then AShape(exact=True), and ``run`` executes that config;
    ``--block-rounded-a-shape`` hands ``False``."""
    import sparse_patterns

    seen = []
    real = sparse_patterns.search_config

    def recording(*args, **kwargs):
        seen.append(kwargs["exact_a_shape"])
        return real(*args, **kwargs)

    monkeypatch.setattr(sparse_patterns, "search_config", recording)
    cfg = tmp_path / "cfg.json"
    assert main(["search", *BASE, "--out", str(cfg)]) == EXIT_OK
    heads = [h for layer in json.loads(cfg.read_text())["layers"] for h in layer]
    plain = [h["pattern"] for h in heads
             if h["pattern"]["kind"] == "a_shape" and h["boundary"]["kind"] == "none"]  # fmt: skip
    assert plain and all(p["exact"] for p in plain)
    method_calls.reset()
    args = ["run", *LONG, "--method", "mminference", "--config", str(cfg), "--max-new-tokens", "2"]
    assert main(args) == EXIT_OK
    method_calls.assert_ran("mminference", calls=2 * 4)
    rounded = tmp_path / "rounded.json"
    assert main(["search", *BASE, "--block-rounded-a-shape", "--out", str(rounded)]) == EXIT_OK
    assert seen == [True, False]
    heads = [h for layer in json.loads(rounded.read_text())["layers"] for h in layer]
    assert not any(h["pattern"].get("exact") for h in heads)


def test_chunked_mlp_is_exact():
    model = engine.tiny_demo_model()
    inputs, layout = engine.video_inputs(model, None, CLIP, "q", frames=4, max_pixels=12544)
    a, _, _ = engine.prefill(model, inputs)
    b, _, _ = engine.prefill(model, inputs, chunk=16)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "argv,code,msg",
    [
        pytest.param(
            ["run", "--model", "tiny", "--video", "/nonexistent.mp4", "--prompt", "q"],
            EXIT_INPUT,
            "no such file",
            id="missing-video",
        ),
        pytest.param(
            ["run", *BASE[:4], "--prompt", " ", "--device", "cpu"],
            EXIT_INPUT,
            "empty prompt",
            id="empty-prompt",
        ),
        pytest.param(
            ["run", *BASE, "--method", "mminference"],
            EXIT_INPUT,
            "needs --config",
            id="mminference-without-config",
        ),
        pytest.param(
            ["run", "--model", "/tmp", "--video", CLIP, "--prompt", "q"],
            EXIT_INPUT,
            "not a checkpoint",
            id="not-a-checkpoint",
        ),
    ],
)
def test_bad_input_one_line_nonzero(argv, code, msg, capsys):
    assert main(argv) == code
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1


def test_corrupt_video_and_foreign_config(tmp_path, capsys):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\x00" * 100)
    assert (
        main(["run", "--model", "tiny", "--video", str(bad), "--prompt", "q", "--device", "cpu"])
        == EXIT_INPUT
    )
    from sparse_patterns import Dense, HeadConfig, PatternConfig

    foreign = tmp_path / "other.json"
    foreign.write_text(
        PatternConfig("other-model", 30, 4, ((HeadConfig(Dense()),) * 4,) * 30, {}).to_json()
    )
    assert main(["run", *BASE, "--method", "mminference", "--config", str(foreign)]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "expected a config for 4 layers x 4 heads (this model), got 30 layers x 4 heads" in err


def test_frames_below_one_is_a_usage_error():
    with pytest.raises(SystemExit) as e:
        main(["run", *BASE[:6], "--frames", "0"])
    assert e.value.code == 2


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


def test_dense_policies_equal_unpatched_exactly(assert_dense_methods_exact):
    """The all-dense TriangleMix policy and an all-Dense pattern config reproduce the unpatched
    model bit for bit; after remove() the model is unpatched again."""
    model = engine.tiny_demo_model()
    inputs, layout = engine.video_inputs(model, None, CLIP, "q", frames=4, max_pixels=12544)
    assert_dense_methods_exact(model, inputs, layout, "tiny")


def test_chunked_norms_and_mlp_restored_and_bad_chunk():
    model = engine.tiny_demo_model()
    lm = engine.language_model(model)
    before = lm.layers[0].input_layernorm.forward
    with engine.chunked_mlp(model, 7):
        assert lm.layers[0].input_layernorm.forward is not before
        x = torch.randn(1, 23, lm.config.hidden_size, generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(lm.norm(x), before.__self__.__class__.forward(lm.norm, x))
    assert lm.layers[0].input_layernorm.forward == before
    from vlm_accel.errors import CliError

    with pytest.raises(CliError, match="--mlp-chunk"), engine.chunked_mlp(model, 0):
        pass


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_fused_parts_match_eager_and_restore(impl):
    """``fused_parts``: the reference is the eager arithmetic bit for bit; the Triton kernels
    (the interpreter on the CPU) agree to rounding. Chunking composes with it, and the modules'
    forwards come back afterwards."""
    import os

    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if impl == "triton" and not (torch.cuda.is_available() or interp):
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    model = engine.tiny_demo_model()
    if impl == "triton" and not interp:  # compiled kernels: the model on the GPU
        model = model.cuda()
    lm = engine.language_model(model)
    inputs, _ = engine.video_inputs(model, None, CLIP, "q", frames=4, max_pixels=12544)
    eager, _, _ = engine.prefill(model, inputs, chunk=16)  # chunking changes the matmul sums
    before = [lm.layers[0].mlp.forward, lm.layers[1].input_layernorm.forward, lm.norm.forward]
    modeling = __import__("sys").modules[type(lm.layers[0].self_attn).__module__]
    rope = modeling.apply_rotary_pos_emb
    seen = []
    with engine.fused_parts(model, impl=impl):
        assert lm.norm.forward != before[2] and lm.layers[0].mlp.forward != before[0]
        fast_rope = modeling.apply_rotary_pos_emb
        assert fast_rope is not rope
        modeling.apply_rotary_pos_emb = lambda *a, **kw: seen.append(1) or fast_rope(*a, **kw)
        fused, _, _ = engine.prefill(model, inputs, chunk=16)
    assert modeling.apply_rotary_pos_emb is rope and len(seen) == len(lm.layers)
    assert [
        lm.layers[0].mlp.forward,
        lm.layers[1].input_layernorm.forward,
        lm.norm.forward,
    ] == before
    # No instance attribute is left behind: the class's forward shows through again.
    assert not any("forward" in m.__dict__ for m in (lm.norm, lm.layers[0].mlp))
    if impl == "reference":
        assert torch.equal(fused, eager)
        # prefill(fused=True) on the CPU takes the reference ("auto")
        again, _, _ = engine.prefill(model, inputs, chunk=16, fused=True)
        assert torch.equal(again, eager)
    else:  # within the budget of eager fp32 against the same model in float64
        import copy

        from sparse_kernels.testing import assert_close_budget

        gold, _, _ = engine.prefill(copy.deepcopy(model).double(), inputs, chunk=16)
        assert_close_budget(fused, eager, gold.double(), dtype=torch.float32)


def test_fused_parts_refuse_an_attention_that_skips_the_module_rotary():
    from vlm_accel.errors import CliError

    model = engine.tiny_demo_model()
    attn = engine.language_model(model).layers[0].self_attn

    class OwnRotary(type(attn)):
        def forward(self, *args, **kwargs):  # stands for a forward that rotates q/k itself
            return super().forward(*args, **kwargs)

    OwnRotary.__module__ = type(attn).__module__  # that module does define the function
    attn.__class__ = OwnRotary
    with pytest.raises(CliError, match="OwnRotary.forward to call its module's"):
        with engine.fused_parts(model):
            pass


def test_fuse_parts_handle_undoes_once():
    model = engine.tiny_demo_model()
    lm = engine.language_model(model)
    modeling = __import__("sys").modules[type(lm.layers[0].self_attn).__module__]
    rope = modeling.apply_rotary_pos_emb
    handle = engine.fuse_parts(model)
    assert "forward" in lm.norm.__dict__ and modeling.apply_rotary_pos_emb is not rope
    handle.remove()
    assert "forward" not in lm.norm.__dict__ and modeling.apply_rotary_pos_emb is rope
    handle.remove()  # a second remove changes nothing
    assert modeling.apply_rotary_pos_emb is rope


def test_fused_parts_refuse_other_norms_and_patch_nothing():
    from vlm_accel.errors import CliError

    model = engine.tiny_demo_model()
    lm = engine.language_model(model)
    before = lm.layers[0].mlp.forward
    lm.layers[-1].post_attention_layernorm = torch.nn.LayerNorm(lm.config.hidden_size)
    with pytest.raises(
        CliError,
        match=r"expected an RMSNorm .* at layers\.\d+\.post_attention_layernorm, got LayerNorm",
    ):
        with engine.fused_parts(model):
            pass
    assert lm.layers[0].mlp.forward == before


def _benchmark_module(name: str):
    """A script of ``apps/vlm-accel/benchmarks`` (not a package) loaded as a module."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _assert_smoke_paths_sparse(mod, method_calls, methods):
    """The smoke run's sparse paths ran at its 1024 tokens with shapes that drop keys there:
    every planned A-shape and Vertical-Slash head, and TriangleMix's triangle layers."""
    from sparse_patterns import AShape, VerticalSlash

    S, dims = 1024, mod.SMOKE
    n, start = dims["layers"], dims["start"]
    timed = [m for m in methods if "trianglemix" not in m]
    # dynamic layers: all of them for mminference, those below start for the mix (timed run)
    planned = sum(n if m in timed else start for m in methods)
    method_calls.assert_ran("plan", calls=planned, applies_from=256)
    assert S in method_calls.lengths["plan"]
    specs = [h.pattern for heads in method_calls.planned_heads for h in heads]
    a_shapes = [p for p in specs if isinstance(p, AShape)]
    vs = [p for p in specs if isinstance(p, VerticalSlash)]
    assert a_shapes and all(p.sink + p.window < S for p in a_shapes), a_shapes
    assert vs and all(p.n_vertical + p.n_slash < S for p in vs), vs
    if any("trianglemix" in m for m in methods):
        # layers start..n-1 at the full length, where a triangle drops keys
        drops_keys_from = dims["window"] + dims["last"] + 1
        assert drops_keys_from <= 512  # also the short warm-up's length
        method_calls.assert_ran("triangle", calls=n - start, applies_from=drops_keys_from)
        assert S in method_calls.lengths["triangle"]


@pytest.mark.parametrize(
    "extra", [[], ["--warmup-tokens", "512", "--single-pass"]], ids=["full-warmup", "short-warmup"]
)
def test_bench_ttft_smoke(tmp_path, extra, method_calls):
    """The GPU benchmark's logic end to end at a tiny CPU shape (also the 1M-row mode: a short
    warm-up, one event-timed pass per row), with every sparse path running where it drops keys."""
    mod = _benchmark_module("bench_ttft")
    out = tmp_path / "t.json"
    assert mod.main(["--smoke", "--out", str(out), *extra]) == 0
    _assert_smoke_paths_sparse(mod, method_calls, ["mminference", "mminference+trianglemix"])
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == list(mod.DEFAULT_METHODS)
    assert all(r["last_hidden_cosine_vs_first_method"] > 0.99 for r in rows)
    assert all(r["single_pass"] == bool(extra) and len(r["times_s"]) == 1 for r in rows)
    assert all(r["warmup_tokens"] == (512 if extra else r["tokens"]) for r in rows)


def test_bench_ttft_block_reaches_the_planner_and_the_exact_kernel(tmp_path, monkeypatch, capsys):
    """``--block 128``: every layer is planned at 128 and the exact Vertical-Slash heads run
    128x128 tiles (the tile FlashAttention-4's path takes); other blocks are refused."""
    import sparse_kernels
    import sparse_patterns

    mod = _benchmark_module("bench_ttft")
    seen = {"plan": set(), "vertical_slash": set()}
    real_plan, real_vs = (
        sparse_patterns.MMInferencePlanner.plan,
        sparse_kernels.vertical_slash_attention,
    )

    def plan_spy(self, *args, **kwargs):
        seen["plan"].add(self.block)
        return real_plan(self, *args, **kwargs)

    def vs_spy(*args, **kwargs):
        seen["vertical_slash"].add((kwargs["block_m"], kwargs["block_n"]))
        return real_vs(*args, **kwargs)

    monkeypatch.setattr(sparse_patterns.MMInferencePlanner, "plan", plan_spy)
    monkeypatch.setattr(sparse_kernels, "vertical_slash_attention", vs_spy)
    out = tmp_path / "t.json"
    args = ["--smoke", "--methods", "mminference", "--exact-verticals", "--warmup-tokens", "512",
            "--single-pass", "--out", str(out)]  # fmt: skip
    assert mod.main([*args, "--block", "128"]) == 0
    assert seen == {"plan": {128}, "vertical_slash": {(128, 128)}}
    assert json.loads(out.read_text())["rows"][0]["env"]["block"] == 128
    out.unlink()
    with pytest.raises(SystemExit) as e:
        mod.main([*args, "--block", "96"])
    assert (
        e.value.code == 2
        and "--block: invalid choice: 96 (choose from 64, 128)" in capsys.readouterr().err
    )
    assert not out.exists()


def test_bench_ttft_fused_methods_smoke(tmp_path, method_calls):
    """``+fused`` rows run the same attention with fused norms, MLP gates and rotary step (the reference on
    the CPU: the eager arithmetic, so dense+fused equals dense bit for bit here)."""
    mod = _benchmark_module("bench_ttft")
    out = tmp_path / "t.json"
    methods = ["dense", "dense+fused", "mminference+trianglemix+fused"]
    assert mod.main(["--smoke", "--methods", ",".join(methods), "--out", str(out)]) == 0
    _assert_smoke_paths_sparse(mod, method_calls, ["mminference+trianglemix"])
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == methods
    assert [r["fused_parts"] for r in rows] == [False, True, True]
    assert rows[1]["last_hidden_cosine_vs_first_method"] == pytest.approx(1.0, abs=1e-6)
    assert rows[2]["last_hidden_cosine_vs_first_method"] > 0.99
    with pytest.raises(SystemExit):
        mod.main(["--smoke", "--methods", "dense+fast", "--out", str(out)])


def test_bench_ttft_cold_start_smoke(tmp_path, monkeypatch, method_calls):
    """``--cold-start`` at the tiny CPU shape: per method a warm-up at 512 tokens, then the first
    and a second prefill at 1024, each timed; the ratios come from the timings, the compile counts
    from the passes (none on the CPU: no Triton kernel runs there), and the rows say whether
    Triton's cache directory was empty when the run started."""
    mod = _benchmark_module("bench_ttft")
    cache, out = tmp_path / "triton-cache", tmp_path / "t.json"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    assert mod.main(["--smoke", "--cold-start", "--out", str(out)]) == 0
    _assert_smoke_paths_sparse(mod, method_calls, ["mminference", "mminference+trianglemix"])
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == list(mod.DEFAULT_METHODS)
    for r in rows:
        assert r["length"] == "smoke-1K" and r["warmup_tokens"] == 512
        assert r["warmup_s"] > 0 and r["first_s"] > 0 and r["warm_s"] > 0
        assert r["first_over_warm"] == pytest.approx(r["first_s"] / r["warm_s"], rel=1e-12)
        assert r["compile_share"] == pytest.approx(r["compile_s"] / r["first_s"], abs=1e-12)
        assert r["compiled_variants"] == r["warm_compiled_variants"] == 0
        assert r["warmup_compiled_variants"] == 0 and r["compiled_by_kernel"] == {}
        assert r["triton_cache_dir"] == str(cache) and r["triton_cache_was_empty"] is True
        assert r["env"]["torch"] == torch.__version__ and r["env"]["head_config"] == "fixed mix"
    cache.mkdir()
    (cache / "entry").write_text("x")
    methods = "mminference+trianglemix+fused"
    argv = ["--smoke", "--cold-start", "--warmup-tokens", "0", "--methods", methods]
    assert mod.main([*argv, "--lengths", "1001", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["length"], row["tokens"]) == ("1001", 1001)  # not a multiple of 16
    assert row["method"] == methods and row["fused_parts"] is True
    assert row["triton_cache_was_empty"] is False
    assert row["warmup_tokens"] == 0 and "warmup_s" not in row
    assert row["first_over_warm"] == pytest.approx(row["first_s"] / row["warm_s"], rel=1e-12)


def test_bench_ttft_cold_start_counts_the_variants_of_each_pass(tmp_path, monkeypatch):
    """The compile figures of a row are the ``CompileLog`` of each pass: a log that sees one
    variant (as Triton's hooks report it) per block gives one per pass, named after its kernel."""
    import types

    import sparse_kernels.tuning as tuning
    import triton

    class OneVariantPerBlock(tuning.CompileLog):
        def __enter__(self):
            log = super().__enter__()
            fn = types.SimpleNamespace(name="stand_in_kernel")
            triton.knobs.runtime.jit_cache_hook(key="k", fn=fn)
            triton.knobs.runtime.jit_post_compile_hook(key="k", fn=fn)
            return log

    monkeypatch.setattr(tuning, "CompileLog", OneVariantPerBlock)
    mod = _benchmark_module("bench_ttft")
    out = tmp_path / "t.json"
    assert mod.main(["--smoke", "--cold-start", "--methods", "dense", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["warmup_compiled_variants"] == row["compiled_variants"] == 1
    assert row["warm_compiled_variants"] == 1
    assert row["compiled_by_kernel"] == {"stand_in_kernel": 1}
    assert 0 < row["compile_s"] < row["first_s"]
    assert row["compile_share"] == pytest.approx(row["compile_s"] / row["first_s"], rel=1e-12)


@pytest.mark.parametrize(
    "extra,msg",
    [
        pytest.param(["--single-pass"], "--cold-start: expected no --single-pass", id="single"),
        pytest.param(["--repeat", "3"], "--cold-start: expected no --repeat", id="repeat"),
        pytest.param(
            ["--search-tokens", "512"], "--cold-start: expected no --search-tokens", id="search"
        ),
        pytest.param(
            ["--warmup-tokens", "1024"],
            "expected fewer than the shortest length (1024) with --cold-start, got 1024",
            id="warmup-not-shorter",
        ),
        pytest.param(
            ["--warmup-tokens", "100"], "expected at least 160 (or 0), got 100", id="warmup-short"
        ),
        pytest.param(
            ["--lengths", "1001,100"],
            "--lengths: expected names of 128K, 256K, 512K, 1M or token counts >= 160, got '100'",
            id="length-short",
        ),
    ],
)
def test_bench_ttft_cold_start_refuses_bad_or_ignored_options(tmp_path, capsys, extra, msg):
    mod = _benchmark_module("bench_ttft")
    out = tmp_path / "t.json"
    with pytest.raises(SystemExit) as e:
        mod.main(["--smoke", "--cold-start", *extra, "--out", str(out)])
    assert e.value.code == 2 and msg in capsys.readouterr().err
    assert not out.exists()


def test_bench_ttft_searches_a_config_and_times_it_then_reads_it_back(tmp_path):
    """``--search-tokens``: the offline search runs on the (bias-structured) model, its config is
    written and timed; ``--config`` reads that file back and times the same per-layer heads;
    a config of another shape is refused with both shapes in the message."""
    mod = _benchmark_module("bench_ttft")
    cfg_path, out = tmp_path / "c.json", tmp_path / "t.json"
    args = ["--smoke", "--methods", "dense,mminference", "--qk-bias-norm", "8"]
    assert mod.main([*args, "--search-tokens", "512", "--search-out", str(cfg_path),
                     "--out", str(out)]) == 0  # fmt: skip
    from sparse_patterns import PatternConfig

    cfg = PatternConfig.load(cfg_path)
    assert (cfg.num_layers, cfg.num_heads) == (mod.SMOKE["layers"], mod.SMOKE["heads"])
    assert cfg.metadata["calibration_tokens"] == 512 and cfg.metadata["qk_bias_norm"] == 8.0
    rows = json.loads(out.read_text())["rows"]
    info = rows[-1]["env"]["head_config"]
    assert info["heads"] == mod.head_kinds(cfg) and sum(info["heads"].values()) == 16
    assert rows[-1]["env"]["qk_bias_norm"] == 8.0
    assert rows[-1]["last_hidden_cosine_vs_first_method"] > 0.99
    for r in rows:  # the core is inside the self_attn module's time; timing it changes nothing
        assert 0.0 < r["attention_core_ms"] <= r["parts_ms"]["attention"]
        assert r["parts_pass_max_abs_diff"] == 0.0
    assert mod.main([*args, "--config", str(cfg_path), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["rows"][-1]["env"]["head_config"]["source"] == str(cfg_path)
    # --exact-a-shape: the search's A-shape candidates are AShape(exact=True).
    assert mod.main([*args, "--exact-a-shape", "--search-tokens", "512", "--search-out",
                     str(cfg_path), "--out", str(out)]) == 0  # fmt: skip
    # Under a boundary an A-shape takes its block-rounded form (boundaries run block-sparse).
    heads = [h for layer in PatternConfig.load(cfg_path).layers for h in layer
             if h.pattern.kind == "a_shape"]  # fmt: skip
    assert heads and all(h.pattern.exact == (h.boundary.kind == "none") for h in heads)
    assert json.loads(out.read_text())["rows"][-1]["env"]["exact_a_shape"] is True
    other = PatternConfig(cfg.model_id, 2, cfg.num_heads, cfg.layers[:2])
    other.save(tmp_path / "o.json")
    with pytest.raises(SystemExit):
        mod.main(["--smoke", "--config", str(tmp_path / "o.json")])


def test_vs_density_script_smoke(tmp_path):
    """The Vertical-Slash density check at bench_ttft's tiny shape: one row per bias norm, a
    density in (0, 1] per head; the bias: one vector of the given norm per KV head, shared by
    its keys and its query heads."""
    mod = _benchmark_module("vs_density_structured")
    out = tmp_path / "d.json"
    assert (
        mod.main(["--smoke", "--tokens", "2048", "--qk-bias-norm", "0,64", "--out", str(out)]) == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["qk_bias_norm"] for r in rows] == [0.0, 64.0]
    for r in rows:
        assert len(r["per_head"]) == len(r["kinds"]) == mod._bench_ttft().SMOKE["heads"]
        assert all(0.0 < d <= 1.0 for d in r["per_head"])
    bt = mod._bench_ttft()
    layer = bt._model(dict(bt.SMOKE, layers=1), "cpu", torch.float32).layers[0]
    bt.structure_qk(layer, 5.0)
    attn = layer.self_attn
    d = attn.head_dim
    kb = attn.k_proj.bias.view(-1, d)
    qb = attn.q_proj.bias.view(kb.shape[0], -1, d)
    torch.testing.assert_close(kb.norm(dim=-1), torch.full((kb.shape[0],), 5.0))
    assert torch.equal(qb, kb[:, None].expand_as(qb))


def test_video_inputs_carry_mm_token_type_ids_for_mrope():
    """Without mm_token_type_ids transformers 5.x uses 1-D positions for the video; the inputs
    must mark every video token (2) and nothing else, and the logits depend on it."""
    model = engine.tiny_demo_model()
    inputs, layout = engine.video_inputs(model, None, CLIP, "q", frames=4, max_pixels=12544)
    vid = inputs["input_ids"] == model.config.video_token_id
    assert torch.equal(inputs["mm_token_type_ids"] == 2, vid)
    assert int(vid.sum()) == layout.counts()[2]
    with_mm = _logits(model, inputs)
    without = _logits(model, {k: v for k, v in inputs.items() if k != "mm_token_type_ids"})
    assert not torch.allclose(with_mm, without)


def test_shipped_tiny_config_fits_the_demo_model_and_runs(capsys, method_calls):
    """The searched config shipped for the tiny Qwen2.5-VL (``vlm-accel search --model tiny
    --frames 64``) loads, matches the demo model's layers and heads, and drives ``run``."""
    from importlib.resources import files

    from sparse_patterns import PatternConfig

    path = files("vlm_accel.configs") / "tiny_qwen2_5_vl.patterns.json"
    cfg = PatternConfig.load(str(path))
    lm_cfg = engine.language_model(engine.tiny_demo_model()).config
    assert (cfg.num_layers, cfg.num_heads) == (
        lm_cfg.num_hidden_layers,
        lm_cfg.num_attention_heads,
    )
    assert cfg.metadata["searched_layers"] == list(range(cfg.num_layers))
    args = ["run", *LONG, "--method", "mminference", "--config", str(path), "--max-new-tokens", "2"]
    assert main(args) == EXIT_OK
    assert "answer (token ids" in capsys.readouterr().out
    method_calls.assert_ran("mminference", calls=2 * cfg.num_layers)
