import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from modality_index.integrations.hf import decode_video, patchify_video, sample_clip_path
from spava_run.cli import main


def test_help_lists_the_options(capsys):
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
    ):
        assert opt in out


@pytest.mark.parametrize(
    "argv,message",
    [
        pytest.param(
            ["--tiny-demo", "--frames", "0"], "--frames: expected >= 1, got 0", id="frames0"
        ),
        pytest.param(
            ["--tiny-demo", "--anchor-len", "-3"], "--anchor-len: expected >= 0", id="neg-anchor"
        ),
        pytest.param(
            ["--tiny-demo", "--video", "/nonexistent.mp4"],
            "no such file: /nonexistent.mp4",
            id="no-video",
        ),
        pytest.param(
            ["--model", "/nonexistent-dir"], "expected a local checkpoint directory", id="no-model"
        ),
    ],
)
def test_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


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
    assert main(["--tiny-demo", "--frames", "4", "--max-new-tokens", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "answer:" in text and "TTFT=" in text and "rank 0:" in text
    res = json.loads(out.read_text())
    assert len(res["tokens"]) == 3 and res["hosts"] == 1


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
