"""End to end across packages: the installed `vlm-accel` entry point in a fresh process
(modality_index decode + layout, triangle_mix policy, sparse_kernels attention, transformers)."""

import ast
import subprocess
import sys
from importlib import metadata

import pytest

pytest.importorskip("transformers")
pytest.importorskip("av")


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    code = "import sys; from vlm_accel.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout
    )


# The CLI in a child process with TriangleMix's triangle_attention counted: the last stderr
# line lists (query length, sink, window, last) of every call.
_COUNTED = """
import sys
import triangle_mix.integrations.hf as tm
real, seen = tm.triangle_attention, []
def spy(q, *args, **kw):
    seen.append((q.shape[2], kw["sink"], kw["window"], kw["last"]))
    return real(q, *args, **kw)
tm.triangle_attention = spy
from vlm_accel.cli import main
code = main(sys.argv[1:])
print(seen, file=sys.stderr)
sys.exit(code)
"""


def test_demo_in_a_fresh_process():
    """The demo's TriangleMix runs its triangle layers (2 of 4, warm-up and timed prefill) at a
    length where the triangle drops keys (S > window + last)."""
    args = ["demo", "--frames", "4", "--max-pixels", "50176", "--device", "cpu"]
    r = subprocess.run([sys.executable, "-c", _COUNTED, *args], capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "dense TTFT" in r.stdout and "trianglemix TTFT" in r.stdout
    assert "next-token argmax" in r.stdout
    calls = ast.literal_eval(r.stderr.strip().splitlines()[-1])
    assert len(calls) == 2 * 2
    assert all(window + last < S for S, _, window, last in calls), calls


def test_version():
    r = _run("--version", timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"vlm-accel {metadata.version('vlm-accel')}"


@pytest.mark.parametrize("command", ["run", "search", "bench", "show", "probe", "demo"])
def test_every_command_has_help(command):
    r = _run(command, "--help", timeout=120)
    assert r.returncode == 0 and f"vlm-accel {command}" in r.stdout
    assert "examples:" in r.stdout and "(default: " in r.stdout


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
            "--frames: expected an integer >= 1, got 0",
            id="frames-0",
        ),  # fmt: skip
        pytest.param(
            ("run", "--model", "tiny", "--video", "sample", "--prompt", "q", "--fps", "nan"),
            2,
            "--fps: expected a finite number > 0, got 'nan'",
            id="fps-nan",
        ),  # fmt: skip
        pytest.param(
            ("run", "--model", "tiny", "--video", "sample", "--prompt", "q", "--device", "gpu"),
            2,
            "--device: expected cpu, cuda or cuda:N, got 'gpu'",
            id="device-bogus",
        ),  # fmt: skip
        pytest.param(("bogus",), 2, "invalid choice", id="unknown-command"),
    ],
)
def test_exit_codes_and_one_line_errors(args, code, msg):
    r = _run(*args, timeout=120)
    assert r.returncode == code, r.stderr
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
