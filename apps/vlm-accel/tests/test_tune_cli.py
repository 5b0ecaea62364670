"""`vlm-accel tune` and `warmup`: flag checks before torch loads, the model's attention shape,
the warmup's plan, and the compile status line. CPU only: no kernel is timed or compiled."""

from __future__ import annotations

import io
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import triton
from vlm_accel import kernels
from vlm_accel.cli import main
from vlm_accel.errors import CliError

K128 = 131072


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_vocabularies_match_the_tuning_package():
    from sparse_kernels.tuning import MODEL_SHAPES, OPS

    assert tuple(MODEL_SHAPES) == kernels.PRESETS and kernels.TUNE_OPS == OPS


def test_help_is_fast_imports_no_torch_and_shows_examples():
    code = (
        "import sys\nfrom vlm_accel.cli import main\n"
        "for cmd in ('tune', 'warmup'):\n"
        "    try:\n        main([cmd, '--help'])\n    except SystemExit:\n        pass\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules), file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "[]", r.stderr
    assert "vlm-accel tune --model" in r.stdout and "vlm-accel warmup --model" in r.stdout


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["tune", "--model", "tiny", "--lengths", "0"], "got '0'"),
        (["tune", "--model", "tiny", "--lengths", "12Q"], "got '12Q'"),
        (["tune", "--model", "tiny", "--lengths", "1K", "--ops", "dense"], "got 'dense'"),
        (["warmup", "--model", "tiny", "--lengths", "1K", "--method", "fast"], "'fast'"),
        (["warmup", "--model", "tiny"], "--lengths"),
        (["warmup", "--model", "tiny", "--lengths", "1K", "--fused", "--mlp-chunk", "0"],
         "argument --mlp-chunk: expected an integer >= 1, got 0"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2_with_one_line(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and msg in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "code", "msg"),
    [
        (["tune", "--model", "tiny", "--lengths", "1K", "--device", "cpu"], 2,
         "--device: expected cuda or cuda:N (tune runs GPU kernels), got 'cpu'"),
        (["tune", "--model", "no/such/dir", "--lengths", "1K"], 3,
         "a checkpoint directory with a config.json, got 'no/such/dir'"),
        (["warmup", "--model", "qwen2.5-vl-7b", "--lengths", "1K", "--method", "mminference"],
         3, "--method mminference needs --config CFG"),
        (["warmup", "--model", "tiny", "--lengths", "1K", "--config", "missing.json"], 3,
         "--config: expected a pattern config JSON file"),
        (["tune", "--model", "tiny", "--lengths", "1K", "--out", "/proc/x/t.json"], 3, "--out"),
        (["tune", "--model", "qwen2-vl-2b", "--lengths", "1K"], 3,
         "tune needs a CUDA GPU; torch sees none"),
        (["warmup", "--model", "tiny", "--lengths", "1K"], 3,
         "warmup needs a CUDA GPU; torch sees none"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_its_exit_code(capsys, monkeypatch, argv, code, msg):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(argv) == code
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1, err


def test_attention_shape_of_a_preset_the_tiny_model_and_a_checkpoint(tmp_path):
    from vlm_accel.models import tiny_config

    assert kernels.attention_shape("smollm2-135m", "bfloat16") == kernels.AttentionShape(
        9, 3, 64, None, "bfloat16"
    )
    cfg = tiny_config("qwen2_5_vl")
    text = cfg.get_text_config()
    want = kernels.AttentionShape(
        text.num_attention_heads, text.num_key_value_heads,
        text.hidden_size // text.num_attention_heads, text.num_hidden_layers, "float16",
    )  # fmt: skip
    assert kernels.attention_shape("tiny", "float16") == want
    cfg.save_pretrained(tmp_path)
    assert kernels.attention_shape(str(tmp_path), "float16") == want
    # warmup's default: the dtype run computes in (the tiny model is float32)
    assert (kernels.run_dtype("tiny"), kernels.run_dtype(str(tmp_path))) == ("float32", "bfloat16")


def test_fused_shape_of_a_preset_the_tiny_model_and_a_checkpoint(tmp_path):
    from vlm_accel.models import tiny_config

    for name in kernels.PRESETS:  # the presets' norms are as wide as their attention
        s, w = kernels.attention_shape(name, "bfloat16"), kernels.fused_shape(name)
        assert w.hidden == s.heads * s.head_dim and w.intermediate > w.hidden, name
    cfg = tiny_config("qwen2_5_vl")
    text = cfg.get_text_config()
    want = kernels.FusedShape(text.hidden_size, text.intermediate_size, text.rms_norm_eps)
    assert kernels.fused_shape("tiny") == want
    cfg.save_pretrained(tmp_path)
    assert kernels.fused_shape(str(tmp_path)) == want


def test_warmup_lengths_add_a_length_off_the_multiples_of_16():
    assert kernels.warmup_lengths([K128, 1 << 20, K128]) == [K128, K128 - 1, 1 << 20, (1 << 20) - 1]


def test_warmup_plan_per_method():
    plan = kernels.warmup_plan
    assert plan("dense", [K128], num_layers=28, start_layer=14) == []
    tri = plan("trianglemix", [K128], num_layers=28, start_layer=14)
    assert [(s.kind, s.length) for s in tri] == [("triangle", K128), ("triangle", K128 - 1)]
    assert plan("trianglemix", [K128], num_layers=28, start_layer=28) == []
    layers = [("X",) * 2, ("X",) * 2, ("Y",) * 2, ("Z",) * 2]  # configs of layers 0..3
    mm = plan("mminference", [K128], num_layers=4, start_layer=None, pattern_layers=layers)
    assert [(s.layer, s.layers) for s in mm[:3]] == [(0, (0, 1)), (2, (2,)), (3, (3,))]
    both = plan("mminference+trianglemix", [4096], num_layers=4, start_layer=3,
                pattern_layers=layers)  # fmt: skip
    assert [(s.kind, s.layer, s.length) for s in both] == [
        ("mminference", 0, 4096), ("mminference", 2, 4096), ("triangle", None, 4096),
        ("mminference", 0, 4095), ("mminference", 2, 4095), ("triangle", None, 4095),
    ]  # fmt: skip
    with pytest.raises(CliError, match="needs --config"):
        plan("mminference", [K128], num_layers=4, start_layer=None)


def test_warmup_plan_adds_the_fused_ops_with_fused_only():
    plan = kernels.warmup_plan
    assert all(s.kind != "fused" for s in plan("trianglemix", [K128], num_layers=28,
                                                 start_layer=14))  # fmt: skip
    tri = plan("trianglemix", [K128], num_layers=28, start_layer=14, fused=True)
    assert [(s.kind, s.length, s.pieces) for s in tri] == [
        ("triangle", K128, ()), ("fused", K128, ((0, K128),)),
        ("triangle", K128 - 1, ()), ("fused", K128 - 1, ((0, K128 - 1),)),
    ]  # fmt: skip
    dense = plan("dense", [K128], num_layers=28, start_layer=None, fused=True)
    assert [(s.kind, s.length) for s in dense] == [("fused", K128), ("fused", K128 - 1)]
    # --mlp-chunk 16384: K128 is 8 full chunks (one variant), K128 - 1 adds the 16383-row tail
    chunked = plan("dense", [K128], num_layers=28, start_layer=None, fused=True,
                   mlp_chunk=16384)  # fmt: skip
    assert [s.pieces for s in chunked] == [((0, 16384),), ((7 * 16384, 16383),)]
    # chunks of 40 rows start at rows 0, 40, 80, ...: two alignments modulo 16 rows
    odd = plan("dense", [130], num_layers=2, start_layer=None, fused=True, mlp_chunk=40)
    assert [s.pieces for s in odd] == [((0, 40), (40, 40), (120, 10)), ((120, 9),)]
    assert kernels.mlp_pieces(130, 40) == [(0, 40), (40, 40), (80, 40), (120, 10)]
    assert kernels.mlp_pieces(40, 40) == kernels.mlp_pieces(40, None) == [(0, 40)]


def test_warmup_steps_run_the_methods_attention_ops():
    """The plan's steps run end to end (on the CPU the ops take their reference paths)."""
    from sparse_patterns import AShape, HeadConfig, VerticalSlash

    heads = (HeadConfig(AShape(sink=4, window=32)),) * 2 + (
        HeadConfig(VerticalSlash(n_vertical=8, n_slash=8, last_q=16)),
    ) * 2
    layers = (heads, heads)
    shape = kernels.AttentionShape(4, 2, 16, 2, "float32")
    steps = kernels.warmup_plan("mminference+trianglemix", [300], num_layers=2, start_layer=1,
                                pattern_layers=layers)  # fmt: skip
    seen = []
    kernels.run_warmup(steps, shape, device="cpu", pattern_layers=layers, tokens_per_frame=16,
                       on_step=seen.append)  # fmt: skip
    assert seen == steps and [s.kind for s in steps] == ["mminference", "triangle"] * 2


def test_compile_status_prints_at_most_one_line_per_second():
    now = [0.0]
    out = Tty()
    status = kernels.CompileStatus(stream=out, clock=lambda: now[0])
    for t, name in [(0.0, "_a"), (0.4, "_b"), (0.99, "_c"), (1.2, "_d"), (1.5, "_e")]:
        now[0] = t
        status(name)
    lines = out.getvalue().splitlines()
    assert [line.split(": ")[-1] for line in lines] == ["_a ...", "_d ..."]
    assert lines[0].startswith("vlm-accel: compiling GPU kernels on first use (cached on disk")
    quiet = Tty()
    kernels.CompileStatus(stream=quiet, no_progress=True)("_a")
    assert quiet.getvalue() == ""


def test_compiling_counts_variants_and_ends_with_a_summary_line():
    rt = triton.knobs.runtime
    out = Tty()
    with kernels.compiling(stream=out) as log:
        for key in (1, 2):
            fn = SimpleNamespace(name="_k")
            rt.jit_cache_hook(key=key, fn=fn)
            rt.jit_post_compile_hook(key=key, fn=fn)
    assert log.count == 2 and (rt.jit_cache_hook, rt.jit_post_compile_hook) == (None, None)
    assert out.getvalue().splitlines()[-1].startswith("vlm-accel: 2 kernel variants compiled")
    with kernels.compiling(enabled=False, stream=out) as off:
        assert off is None


@pytest.fixture
def on_cpu(monkeypatch):
    """tune and warmup as on a GPU, with the CPU standing in for it (reference attention)."""
    monkeypatch.setattr(kernels, "need_cuda", lambda command, device: "cpu")


def test_tune_passes_the_models_shape_and_flags_to_the_tuner(on_cpu, monkeypatch, capsys, tmp_path):
    import sparse_kernels.tuning as skt
    from vlm_accel.models import tiny_config

    calls = []

    def fake_tune(shape, lengths, **kw):
        calls.append((shape, lengths, kw))
        return SimpleNamespace(path=tmp_path / "t.json", tuned=(1, 2), skipped=(), failures=())

    monkeypatch.setattr(skt, "tune", fake_tune)
    argv = ["tune", "--model", "tiny", "--lengths", "128K,32K", "--ops", "triangle",
            "--out", str(tmp_path / "t.json"), "--force"]  # fmt: skip
    assert main(argv) == 0
    text = tiny_config("qwen2_5_vl").get_text_config()
    ((shape, lengths, kw),) = calls
    assert (shape.heads, shape.kv_heads, shape.dtype) == (
        text.num_attention_heads, text.num_key_value_heads, "bfloat16",
    )  # fmt: skip
    assert lengths == [32768, K128] and kw["ops"] == ["triangle"] and kw["force"] is True
    assert kw["out"] == str(tmp_path / "t.json") and kw["command"] == "vlm-accel " + " ".join(argv)
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 't.json'}: 2 entries tuned")


def test_warmup_flags_of_the_fused_ops_are_checked(on_cpu, capsys, tmp_path):
    argv = ["warmup", "--model", "tiny", "--lengths", "1K", "--mlp-chunk", "512"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--mlp-chunk: expected it with --fused" in err and "512 without --fused" in err
    assert len(err.strip().splitlines()) == 1
    from vlm_accel.models import tiny_config

    cfg = tiny_config("qwen2_5_vl")
    cfg.text_config.hidden_act = "gelu"
    cfg.save_pretrained(tmp_path)
    assert main(["warmup", "--model", str(tmp_path), "--lengths", "1K", "--fused"]) == 3
    err = capsys.readouterr().err
    assert "--fused: expected a language model with a SiLU-gated MLP" in err and "'gelu'" in err


def _signature(value):
    """What makes Triton choose a variant: a tensor's shape, strides, dtype and 16-byte
    alignment; any other argument as it is."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.stride(), value.dtype, value.data_ptr() % 16 == 0
    return value


@pytest.fixture
def fused_calls(monkeypatch):
    """The calls of the fused ops, as signatures, through ``sparse_kernels.fused`` and the HF
    integration's own names for them."""
    import sparse_kernels.fused as ops
    import sparse_kernels.integrations.hf as hf

    calls = set()

    def recording(name, fn):
        def record(*args, **kw):
            calls.add((name, tuple(map(_signature, args)),
                       tuple(sorted((k, _signature(v)) for k, v in kw.items()))))  # fmt: skip
            return fn(*args, **kw)

        return record

    for name in ("rms_norm", "silu_mul", "rotary"):
        record = recording(name, getattr(ops, name))
        monkeypatch.setattr(ops, name, record)
        monkeypatch.setattr(hf, name, record)
    return calls


def test_fused_warmup_makes_the_calls_of_a_fused_chunked_prefill(fused_calls):
    """Every fused-op call of the tiny model's ``prefill(fused=True, chunk=...)`` is one the
    warmup of its length makes: same op, shapes, strides, dtypes, alignment and keywords."""
    from modality_index.integrations.hf import sample_clip_path
    from vlm_accel import engine

    model = engine.tiny_demo_model()
    inputs, _ = engine.video_inputs(model, None, str(sample_clip_path()), "q", frames=4,
                                    max_pixels=12544)  # fmt: skip
    S = inputs["input_ids"].shape[1]
    chunk = 24  # not a multiple of 16: chunks start at two alignments
    assert 2 * chunk < S and S % chunk
    engine.prefill(model, inputs, chunk=chunk, fused=True)
    prefill = set(fused_calls)
    assert {c[0] for c in prefill} == {"rms_norm", "silu_mul", "rotary"}
    fused_calls.clear()
    steps = kernels.warmup_plan("dense", [S], num_layers=None, start_layer=None, fused=True,
                                mlp_chunk=chunk)  # fmt: skip
    kernels.run_warmup(steps, kernels.attention_shape("tiny", "float32"), device="cpu",
                       fused=kernels.fused_shape("tiny"))  # fmt: skip
    assert prefill <= fused_calls, prefill - fused_calls
    with pytest.raises(ValueError, match="expected fused=FusedShape"):
        kernels.run_warmup(steps, kernels.attention_shape("tiny", "float32"), device="cpu")


def test_warmup_command_runs_its_plan_and_prints_the_summary(on_cpu, capsys):
    assert main(["warmup", "--model", "tiny", "--lengths", "700", "--start-layer", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("warmup trianglemix at 700 tokens: 0 kernel variants compiled or loaded")
    assert main(["warmup", "--model", "tiny", "--lengths", "700", "--method", "dense"]) == 0
    assert "nothing to compile" in capsys.readouterr().out


def test_warmup_command_with_fused_runs_the_fused_ops(on_cpu, capsys, fused_calls):
    argv = ["warmup", "--model", "tiny", "--lengths", "700", "--start-layer", "1", "--fused",
            "--mlp-chunk", "256"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("warmup trianglemix --fused at 700 tokens: ")
    assert "Triton's disk cache holds them" in out
    rotary_lengths = {c[1][0][0][2] for c in fused_calls if c[0] == "rotary"}
    norm_rows = {c[1][0][0][1] for c in fused_calls if c[0] == "rms_norm"}
    assert rotary_lengths == {700, 699} and norm_rows == {256, 188, 187}
    fused_calls.clear()
    assert main(["warmup", "--model", "tiny", "--lengths", "700", "--method", "dense",
                 "--fused"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("warmup dense --fused at 700 tokens: ")
    assert {c[0] for c in fused_calls} == {"rms_norm", "silu_mul", "rotary"}
