"""End to end across packages: the installed `vlm-accel` entry point in a fresh process
(modality_index decode + layout, triangle_mix policy, sparse_kernels attention, transformers)."""

import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("av")


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    code = "import sys; from vlm_accel.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout
    )


def test_demo_in_a_fresh_process():
    r = _run("demo", "--frames", "4", "--max-pixels", "12544", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "dense TTFT" in r.stdout and "trianglemix TTFT" in r.stdout
    assert "next-token argmax same" in r.stdout


@pytest.mark.parametrize("command", ["run", "search", "bench", "show", "demo"])
def test_every_command_has_help(command):
    r = _run(command, "--help", timeout=120)
    assert r.returncode == 0 and f"vlm-accel {command}" in r.stdout


@pytest.mark.parametrize(
    "args,code,msg",
    [
        pytest.param(
            ("run", "--model", "tiny", "--video", "/no/such.mp4", "--prompt", "q"),
            3,
            "no such file",
            id="missing-video",
        ),  # fmt: skip
        pytest.param(
            ("run", "--model", "tiny", "--video", "x.mp4", "--prompt", "q", "--frames", "0"),
            2,
            "--frames",
            id="frames-0",
        ),  # fmt: skip
        pytest.param(("bogus",), 2, "invalid choice", id="unknown-command"),
    ],
)
def test_exit_codes_and_one_line_errors(args, code, msg):
    r = _run(*args, timeout=120)
    assert r.returncode == code, r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr
