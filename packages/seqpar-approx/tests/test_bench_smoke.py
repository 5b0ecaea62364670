"""The torchrun benchmark script runs end to end (tiny shapes, CPU, gloo)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_spava.py"


@pytest.mark.slow
def test_bench_script_smoke(tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = tmp_path / "b.json"
    cmd = [
        torchrun,
        "--nproc-per-node",
        "2",
        str(BENCH),
        "--smoke",
        "--seq-lens",
        "700",
        "--reps",
        "1",
        "--frames",
        "4",
        "--frame-patches",
        "4",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert all(c["max_abs_err"] < 1e-4 for c in rep["checks"]), rep["checks"]
    methods = {(r["mode"], r["method"]) for r in rep["results"]}
    assert ("model", "spava-no-fused") in methods and ("vision", "frame-parallel") in methods
    assert ("model", "spava+mminference+trianglemix") in methods


def test_bench_script_smoke_sparse_hosts(tmp_path):
    """Spava with MMInference + TriangleMix hosts (a block-sparse prefix, the short anchor
    dense): checked against the simulation at the first (MMInference) and last (triangle) layer,
    timed, and split into sections per rank."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = tmp_path / "b.json"
    cmd = [torchrun, "--nproc-per-node", "2", str(BENCH), "--smoke", "--seq-lens", "700"]
    cmd += ["--reps", "1", "--warmup", "0", "--modes", "model", "--no-torch-cp", "--out", str(out)]
    cmd += ["--methods", "spava,spava+mminference+trianglemix", "--prefix-blocks", "1"]
    cmd += ["--dense-rows", "96", "--fused-parts"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["mminference_hosts"] == {"block": 16, "prefix_blocks": 1, "dense_rows": 96}
    checked = {(c["method"], c["layer"]) for c in rep["checks"]}
    assert {("spava+mminference+trianglemix", 0), ("spava+mminference+trianglemix", 1)} <= checked
    assert all(c["max_abs_err"] < 1e-4 for c in rep["checks"]), rep["checks"]
    (r,) = [r for r in rep["results"] if r["method"] == "spava+mminference+trianglemix"]
    assert r["ttft_s"] > 0 and len(r["sections_per_rank"]) == 2
    assert all(row["fused_parts"] for row in rep["results"])
    for sec in r["sections_per_rank"]:
        assert set(sec) == {"attention", "estimation", "mlp", "communication"}, sec


def test_fused_parts_layer_matches_the_eager_layer():
    """``--fused-parts``: the layer with ``sparse_kernels.fused``'s steps (their references on the
    CPU) gives the eager layer's output, fp32."""
    sys.path.insert(0, str(BENCH.parent))
    import bench_spava as b
    import torch

    torch.manual_seed(0)
    m = b.MODEL_SMOKE
    layer = b.Layer(m)
    for lin in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down):
        torch.nn.init.normal_(lin.weight, std=0.1)
    layer.n1.weight.data.uniform_(0.5, 1.5)
    layer.n2.weight.data.uniform_(0.5, 1.5)
    S = 40
    h = torch.randn(S, m["hidden"])
    cos, sin = b.rope_tables(torch.arange(S), m["head_dim"], "cpu", torch.float32)
    dense = lambda q, k, v: b.attention(q, k, v, causal=True).out  # noqa: E731
    with torch.no_grad():
        want = b.layer_forward(layer, h, cos, sin, dense, None, mlp_chunk=16)
        got = b.layer_forward(layer, h, cos, sin, dense, None, mlp_chunk=16, parts=b.FusedParts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _smoke_config(path: Path, layers: int) -> None:
    """A pattern config of the smoke model's heads (4), every head an exact A-shape."""
    from sparse_patterns import AShape, HeadConfig, PatternConfig

    heads = (HeadConfig(AShape(sink=8, window=64, exact=True)),) * 4
    PatternConfig(
        model_id="bench-smoke", num_layers=layers, num_heads=4, layers=(heads,) * layers
    ).save(path)


def test_bench_script_takes_a_pattern_config_for_the_mminference_hosts(tmp_path):
    """--config replaces the fixed head mix: the run is checked against the simulation with the
    config's heads and the report names the file."""
    cfg = tmp_path / "cfg.json"
    _smoke_config(cfg, layers=2)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = tmp_path / "b.json"
    cmd = [torchrun, "--nproc-per-node", "2", str(BENCH), "--smoke", "--seq-lens", "700"]
    cmd += ["--reps", "1", "--warmup", "0", "--modes", "model", "--no-torch-cp", "--out", str(out)]
    cmd += ["--methods", "spava+mminference", "--config", str(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["head_config"] == str(cfg)
    checked = {(c["method"], c["layer"]) for c in rep["checks"]}
    assert ("spava+mminference", 0) in checked
    assert all(c["max_abs_err"] < 1e-4 for c in rep["checks"]), rep["checks"]


@pytest.mark.parametrize(
    ("write", "expected"),
    [
        (
            lambda p: _smoke_config(p, layers=3),
            "expected (layers, heads) = (2, 4) of the model, got (3, 4)",
        ),
        (lambda p: p.write_text("{not json"), "expected a readable pattern config JSON"),
    ],
    ids=["wrong-shape", "not-json"],
)
def test_bench_script_rejects_a_config_before_starting(tmp_path, write, expected):
    """A config that does not fit the model is a usage error (exit 2) raised while parsing,
    before any process group starts (plain python, no torchrun)."""
    cfg = tmp_path / "cfg.json"
    write(cfg)
    cmd = [sys.executable, str(BENCH), "--smoke", "--config", str(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert expected in proc.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--prefix-blocks", "0"], "--prefix-blocks: expected an int >= 1, got 0"),
        (["--block", "32"], "--block: invalid choice: 32"),
        (["--dense-rows", "-1"], "--dense-rows: expected an int >= 0, got -1"),
        (
            ["--dense-rows", "4096", "--methods", "spava,spava+trianglemix"],
            "--dense-rows: expected a spava+mminference method in --methods",
        ),
    ],
    ids=["prefix-blocks", "block", "dense-rows", "dense-rows-without-mminference"],
)
def test_bench_script_rejects_bad_sparse_options_before_starting(args, expected):
    """Out-of-range sparse-host options are usage errors (exit 2) before any process group."""
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert expected in proc.stderr
