"""``spava-run --sparse``: flag checks before the run, the config against the model, and the
tiny demo with MMInference + TriangleMix inside every host (timings split per section)."""

import json

import pytest
from spava_run.cli import main


def _usage_error(argv, monkeypatch, capsys):
    import spava_run.cli as cli

    def run(args):
        raise AssertionError("the run started before the arguments were checked")

    monkeypatch.setattr(cli, "_run", run)
    try:
        rc = main(["--tiny-demo", *argv])
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spava-run: error: "), err
    return rc, err


@pytest.mark.parametrize(
    "argv, code, message",
    [
        pytest.param(
            ["--sparse", "mminference+tri"],
            2,
            "argument --sparse: invalid choice: 'mminference+tri'",
            id="bad-choice",
        ),
        pytest.param(
            ["--method", "ring", "--sparse", "trianglemix"],
            2,
            "--sparse trianglemix: expected --method spava, got --method ring",
            id="not-spava",
        ),
        pytest.param(
            ["--sparse", "mminference"],
            2,
            "--sparse mminference: expected --config CFG (an MMInference pattern config JSON), "
            "got none",
            id="no-config",
        ),
        pytest.param(
            ["--sparse", "trianglemix", "--config", "{tmp}/c.json"],
            2,
            "--config: expected with --sparse mminference or mminference+trianglemix, got "
            "--sparse trianglemix",
            id="config-unused",
        ),
        pytest.param(
            ["--sparse", "mminference", "--config", "{tmp}/c.json", "--start-layer", "3"],
            2,
            "--start-layer: expected with --sparse trianglemix or mminference+trianglemix, got "
            "--sparse mminference",
            id="start-unused",
        ),
        pytest.param(
            ["--sparse", "trianglemix", "--prefix-blocks", "4"],
            2,
            "--prefix-blocks: expected with --sparse mminference or mminference+trianglemix, got "
            "--sparse trianglemix",
            id="prefix-unused",
        ),
        pytest.param(
            ["--sparse", "trianglemix", "--dense-rows", "4096"],
            2,
            "--dense-rows: expected with --sparse mminference or mminference+trianglemix, got "
            "--sparse trianglemix",
            id="dense-rows-unused",
        ),
        pytest.param(
            ["--sparse", "mminference", "--config", "{tmp}/c.json", "--dense-rows", "-1"],
            2,
            "argument --dense-rows: expected an integer >= 0, got -1",
            id="dense-rows-negative",
        ),
        pytest.param(
            ["--sparse", "mminference", "--config", "{tmp}/c.json", "--prefix-blocks", "0"],
            2,
            "argument --prefix-blocks: expected an integer >= 1, got 0",
            id="prefix-zero",
        ),
        pytest.param(
            ["--sparse", "mminference", "--config", "{tmp}/none.json"],
            3,
            "--config: expected a pattern config JSON file, got '{tmp}/none.json'",
            id="config-missing",
        ),
        pytest.param(
            ["--sparse", "mminference", "--config", "{tmp}/bad.json"],
            3,
            "--config: {tmp}/bad.json is not readable JSON (Expecting value",
            id="config-not-json",
        ),
    ],
)
def test_sparse_flags_are_checked_before_the_run(
    argv, code, message, tmp_path, monkeypatch, capsys
):
    (tmp_path / "c.json").write_text("{}")
    (tmp_path / "bad.json").write_text("layers: 3")
    argv = [a.format(tmp=tmp_path) for a in argv]
    rc, err = _usage_error(argv, monkeypatch, capsys)
    assert rc == code
    assert message.format(tmp=tmp_path) in err, err


def _tiny_patterns(path, *, layers=None):
    from seqpar_approx.integrations.hf import tiny_qwen2_5_vl_config
    from seqpar_approx.testing_hosts import case_heads
    from sparse_patterns import PatternConfig

    text = tiny_qwen2_5_vl_config().get_text_config()
    L = text.num_hidden_layers if layers is None else layers
    H = text.num_attention_heads
    cfg = PatternConfig(model_id="tiny", num_layers=L, num_heads=H, layers=(case_heads(H),) * L)
    path.write_text(cfg.to_json())
    return L


def test_config_of_another_model_exits_3_before_the_weights_load(tmp_path, capsys):
    cfg = tmp_path / "p.json"
    _tiny_patterns(cfg, layers=5)
    rc = main(["--tiny-demo", "--sparse", "mminference", "--config", str(cfg)])
    assert rc == 3
    err = capsys.readouterr().err
    assert "--config: expected a pattern config of 2 layers x 4 heads (the model's), got 5 x 4" in (
        err
    ), err
    assert "loading" not in err


def test_start_layer_past_the_model_exits_2(capsys):
    assert main(["--tiny-demo", "--sparse", "trianglemix", "--start-layer", "3"]) == 2
    assert "--start-layer: expected 0..2 (the model's layers), got 3" in capsys.readouterr().err


def test_tiny_demo_with_mminference_and_trianglemix(tmp_path, capsys):
    cfg, out = tmp_path / "p.json", tmp_path / "r.json"
    _tiny_patterns(cfg)
    argv = ["--tiny-demo", "--frames", "4", "--max-new-tokens", "3", "--json", str(out)]
    argv += ["--anchor-len", "4", "--passing-len", "2"]
    argv += ["--sparse", "mminference+trianglemix", "--config", str(cfg), "--start-layer", "1"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert "spava + mminference+trianglemix prefill, compiling kernels on first use ..." in cap.err
    assert "prefill sections: attention " in cap.out and "sparse=mminference+trianglemix" in cap.out
    res = json.loads(out.read_text())
    (r,) = res["per_rank"]
    assert res["sparse"] == "mminference+trianglemix"
    for k in ("attention_s", "estimation_s", "mlp_s", "communication_s"):
        assert r[k] > 0, (k, r)
    assert (
        sum(r[k] for k in ("attention_s", "estimation_s", "mlp_s", "communication_s"))
        <= (r["prefill_s"])
    )


def test_prefix_blocks_reach_the_mminference_layers(tmp_path):
    from seqpar_approx import PrefixBlocks
    from seqpar_approx.integrations.hf import tiny_qwen2_5_vl_config
    from spava_run.parser import build_parser
    from spava_run.sparse import sparsity_for

    cfg = tmp_path / "p.json"
    _tiny_patterns(cfg)
    argv = ["--tiny-demo", "--sparse", "mminference", "--config", str(cfg), "--prefix-blocks", "3"]
    args = build_parser().parse_args(argv)
    assert sparsity_for(args, tiny_qwen2_5_vl_config()).prefix == PrefixBlocks(top_k=3)


def test_dense_rows_reach_the_mminference_layers(tmp_path):
    from seqpar_approx.integrations.hf import tiny_qwen2_5_vl_config
    from spava_run.parser import build_parser
    from spava_run.sparse import sparsity_for

    cfg = tmp_path / "p.json"
    _tiny_patterns(cfg)
    argv = ["--tiny-demo", "--sparse", "mminference", "--config", str(cfg), "--dense-rows", "96"]
    sp = sparsity_for(build_parser().parse_args(argv), tiny_qwen2_5_vl_config())
    assert sp.dense_rows == 96 and sp.for_layer(0).dense_rows == 96
