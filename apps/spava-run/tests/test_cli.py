import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
import torch
from modality_index.integrations.hf import decode_video, patchify_video, sample_clip_path
from spava_run.cli import main


def test_help_lists_the_options_examples_and_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in (
        "--model",
        "--video",
        "--prompt",
        "--frames",
        "--method",
        "--anchor-len",
        "--passing-len",
        "--tiny-demo",
        "--version",
    ):
        assert opt in out
    for default in (
        "(default: spava)",
        "(default: 16)",
        "(default: 32)",
        "(default: 600.0)",
        "(default: Describe the video.)",
        "(default: bfloat16 on CUDA, float32 on CPU)",
    ):
        assert default in " ".join(out.split()), default
    assert "{bfloat16,float16,float32}" in out
    assert "examples:" in out and "torchrun --nproc-per-node 2 -m spava_run.cli" in out
    assert "exit codes: 0 ok, 1 internal error, 2 usage" in out and "4 out of memory" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("spava-run ")


def test_help_and_version_are_fast_and_import_no_torch():
    code = "import sys, spava_run.cli; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == (
        "False\n"
    )
    script = os.path.join(os.path.dirname(sys.executable), "spava-run")
    for flag in ("--help", "--version"):
        t0 = time.monotonic()
        proc = subprocess.run([script, flag], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and time.monotonic() - t0 < 2.0, (flag, proc.stderr)


def _read_only_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    return d


@pytest.mark.parametrize(
    "argv, code, message",
    [
        pytest.param(
            ["--frames", "0"], 2, "--frames: expected an integer >= 1, got 0", id="frames0"
        ),
        pytest.param(
            ["--frames", "x"], 2, "--frames: expected an integer >= 1, got 'x'", id="frames-x"
        ),
        pytest.param(
            ["--max-pixels", "-5"],
            2,
            "--max-pixels: expected an integer >= 784, got -5",
            id="px-neg",
        ),
        pytest.param(
            ["--max-pixels", "0"], 2, "--max-pixels: expected an integer >= 784, got 0", id="px0"
        ),
        pytest.param(
            ["--stall-timeout", "nan"], 2, "expected finite seconds > 0, got 'nan'", id="nan"
        ),
        pytest.param(
            ["--stall-timeout", "inf"], 2, "expected finite seconds > 0, got 'inf'", id="inf"
        ),
        pytest.param(["--stall-timeout", "0"], 2, "expected finite seconds > 0, got '0'", id="t0"),
        pytest.param(
            ["--max-new-tokens", "0"],
            2,
            "--max-new-tokens: expected an integer >= 1, got 0",
            id="tok0",
        ),
        pytest.param(
            ["--anchor-len", "-3"],
            2,
            "--anchor-len: expected an integer >= 0, got -3",
            id="neg-anchor",
        ),
        pytest.param(
            ["--prompt", " "], 2, "--prompt: expected a non-empty text, got ' '", id="prompt"
        ),
        pytest.param(["--dtype", "bf16"], 2, "invalid choice: 'bf16'", id="dtype-bf16"),
        pytest.param(
            ["--video", "/nonexistent.mp4"],
            3,
            "--video: no such file: /nonexistent.mp4",
            id="no-video",
        ),
        pytest.param(
            ["--json", "{tmp}"],
            3,
            "--json: expected a file path, got the directory {tmp}",
            id="json-dir",
        ),
        pytest.param(
            ["--json", "{tmp}/missing/r.json"],
            3,
            "--json: expected a file in an existing directory, got {tmp}/missing/r.json",
            id="json-missing-dir",
        ),
        pytest.param(
            ["--json", "{ro}/r.json"],
            3,
            "--json: expected a writable directory for {ro}/r.json, got {ro} (Permission denied)",
            id="json-read-only",
            marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only dirs"),
        ),
        pytest.param(
            ["--json", "/sys/r.json"],
            3,
            "--json: expected a writable directory for /sys/r.json, got /sys (",
            id="json-read-only-fs",
            marks=pytest.mark.skipif(
                os.access("/sys", os.W_OK) and os.geteuid() != 0, reason="/sys is writable here"
            ),
        ),
    ],
)
def test_bad_input_is_one_line_with_its_exit_code_before_the_run(
    argv, code, message, tmp_path, monkeypatch, capsys
):
    import spava_run.cli as cli

    def run(args):
        raise AssertionError("the run started before the arguments were checked")

    monkeypatch.setattr(cli, "_run", run)
    ro = _read_only_dir(tmp_path)
    fill = {"tmp": str(tmp_path), "ro": str(ro)}
    argv = [a.format(**fill) for a in argv]
    try:
        rc = main(["--tiny-demo", *argv])
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    assert rc == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spava-run: error: "), err
    assert message.format(**fill) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro"]
    assert list(ro.iterdir()) == []


def test_model_errors_exit_3(tmp_path, capsys):
    assert main(["--model", "/nonexistent-dir"]) == 3
    assert "--model: expected a local checkpoint directory, got '/nonexistent-dir'" in (
        capsys.readouterr().err
    )
    assert main(["--model", str(tmp_path)]) == 3
    assert "expected a checkpoint directory with a config.json" in capsys.readouterr().err


def test_errors_name_the_rank_under_a_launcher(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["--tiny-demo", "--video", "/nonexistent.mp4"]) == 3
    assert capsys.readouterr().err == (
        "spava-run: rank 1: error: --video: no such file: /nonexistent.mp4\n"
    )


@pytest.mark.parametrize(
    "exc, code, line",
    [
        pytest.param(
            MemoryError("16 GiB"), 4, "spava-run: error: out of memory (16 GiB)", id="oom"
        ),
        pytest.param(
            torch.OutOfMemoryError("CUDA out of memory.\nTried to allocate"),
            4,
            "spava-run: error: out of GPU memory (CUDA out of memory.)",
            id="cuda-oom",
        ),
        pytest.param(
            RuntimeError("boom\nmore"), 1, "spava-run: internal error: RuntimeError: boom", id="bug"
        ),
    ],
)
def test_failures_during_the_run_are_one_line_with_their_code(exc, code, line, monkeypatch, capsys):
    import spava_run.cli as cli

    def run(args):
        raise exc

    monkeypatch.setattr(cli, "_run", run)
    assert main(["--tiny-demo"]) == code
    assert capsys.readouterr().err == line + "\n"


def test_json_write_is_atomic_with_the_umask(tmp_path):
    from spava_run.cli import write_text_atomic

    target = tmp_path / "r.json"
    old = os.umask(0o027)
    try:
        write_text_atomic(target, "{}\n")
    finally:
        os.umask(old)
    assert target.read_text() == "{}\n" and stat.S_IMODE(target.stat().st_mode) == 0o640
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        write_text_atomic(tmp_path / "d", "{}")  # a directory cannot be replaced by a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "r.json"]


def test_accelerate_cpu_launch_of_two_processes_is_refused(tmp_path):
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    cmd = [accelerate, "launch", "--cpu", "--num_processes", "2", "-m", "spava_run.cli"]
    cmd += ["--tiny-demo", "--json", str(tmp_path / "r.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0
    assert (
        "spava-run: error: the launcher was asked for 2 processes (accelerate launch "
        "--num_processes 2) but this process runs alone (world size 1" in proc.stderr
    ), proc.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []


def test_patchify_matches_qwen_geometry():
    frames = torch.randint(0, 255, (5, 60, 90, 3), dtype=torch.uint8)
    pix, grid = patchify_video(frames, max_pixels=56 * 84)
    t, h, w = grid[0].tolist()
    assert (t, h % 2, w % 2) == (3, 0, 0)  # 5 frames padded to 6 -> 3 temporal groups
    assert pix.shape == (t * h * w, 3 * 2 * 14 * 14)


def test_decode_video_samples_uniformly():
    frames = decode_video(sample_clip_path(), 5)
    assert frames.shape[0] == 5 and frames.shape[-1] == 3 and frames.dtype == torch.uint8


def test_tiny_demo_single_process(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["--tiny-demo", "--frames", "4", "--max-new-tokens", "24", "--json", str(out)]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert "answer:" in cap.out and "TTFT=" in cap.out
    assert (
        "rank 0: TTFT " in cap.out and "= vision " in cap.out and "(of which attention " in cap.out
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert f"spava-run: loading the tiny demo model on 1 rank(s), {device} ..." in cap.err
    assert "spava-run: spava prefill, compiling kernels on first use ..." in cap.err
    res = json.loads(out.read_text())
    assert len(res["tokens"]) == 24 and res["hosts"] == 1
    # the parts add up: TTFT = vision + prefill, attention is a part of the prefill
    (r,) = res["per_rank"]
    assert r["ttft_s"] == pytest.approx(r["vision_s"] + r["prefill_s"], rel=1e-6)
    assert 0 < r["prefill_attention_s"] <= r["prefill_s"]
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.slow
def test_tiny_demo_under_torchrun_two_ranks(tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = tmp_path / "r.json"
    cmd = [
        torchrun,
        "--nproc-per-node",
        "2",
        "-m",
        "spava_run.cli",
        "--tiny-demo",
        "--frames",
        "8",
        "--max-new-tokens",
        "3",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["hosts"] == 2 and len(res["per_rank"]) == 2
