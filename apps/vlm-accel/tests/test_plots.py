import pytest
from matplotlib.container import ErrorbarContainer
from vlm_accel.plots import bench_figure


def _rows():
    return [
        {"method": "dense", "tokens": 812, "ttft_s": 0.0412, "ttft_runs_s": [0.0401, 0.0412, 0.045],
         "top1_agrees_with_first": True},
        {"method": "trianglemix", "tokens": 812, "ttft_s": 0.0206, "ttft_runs_s": [0.02, 0.0206, 0.03],
         "top1_agrees_with_first": False},
    ]  # fmt: skip


def test_bench_figure_has_title_device_speedups_and_error_bars():
    fig = bench_figure(_rows(), device="NVIDIA H100 80GB HBM3")
    sup = fig._suptitle.get_text()
    assert "812 tokens" in sup and "NVIDIA H100 80GB HBM3" in sup and "over dense" in sup
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["41.2 ms  baseline", "20.6 ms  2.00x"]
    assert ax.get_xlabel().startswith("time to first token (ms)")
    assert "min-max of 3 repeats" in ax.get_xlabel()
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks == ["dense", "trianglemix\n(next token differs)"]
    # Error bars: one whisker segment per bar, from the fastest to the slowest repeat.
    errs, bars = ax.containers
    assert isinstance(errs, ErrorbarContainer) and errs.has_xerr
    segs = errs.lines[2][0].get_segments()
    assert [(round(s[0][0], 4), round(s[1][0], 4)) for s in segs] == [(40.1, 45.0), (20.0, 30.0)]
    assert [round(r.get_width(), 4) for r in bars.patches] == [41.2, 20.6]


def test_bench_figure_seconds_and_custom_baseline():
    rows = [
        {"method": "a", "tokens": 10, "ttft_s": 2.0, "ttft_runs_s": [2.0]},
        {"method": "b", "tokens": 10, "ttft_s": 4.0, "ttft_runs_s": [4.0]},
    ]
    fig = bench_figure(rows, device="cpu", baseline="b", title="my run")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.texts] == ["2 s  2.00x", "4 s  baseline"]
    assert ax.get_xlabel().startswith("time to first token (s)")
    assert fig._suptitle.get_text().startswith("my run\ncpu")


@pytest.mark.parametrize(
    "change, kw, match",
    [
        pytest.param({}, {"baseline": "mminference"}, r"methods \['dense', 'trianglemix'\], got 'mminference'", id="no-baseline"),
        pytest.param({"ttft_runs_s": []}, {}, "non-empty list of seconds, got", id="no-runs"),
        pytest.param({"ttft_runs_s": [0.1, float("nan")]}, {}, "finite positive seconds", id="nan-run"),
        pytest.param({"ttft_s": 1.0}, {}, r"within its runs \[0.0401, 0.045\], got 1.0", id="median-outside"),
        pytest.param({"tokens": 9}, {}, "one prompt length", id="tokens"),
        pytest.param({"method": "trianglemix"}, {}, "each method once", id="duplicate"),
        pytest.param({"ttft_runs_s": None}, {}, "non-empty list", id="runs-none"),
    ],
)  # fmt: skip
def test_bench_figure_errors(change, kw, match):
    rows = _rows()
    rows[0].update(change)
    with pytest.raises(ValueError, match=match):
        bench_figure(rows, device="cpu", **kw)


def test_bench_figure_missing_keys_and_device():
    with pytest.raises(ValueError, match=r"missing \['ttft_runs_s'\]"):
        bench_figure([{"method": "dense", "tokens": 1, "ttft_s": 1.0}], device="cpu")
    with pytest.raises(ValueError, match="non-empty list of dicts"):
        bench_figure([], device="cpu")
    with pytest.raises(ValueError, match="device's name, got ''"):
        bench_figure(_rows(), device="")
