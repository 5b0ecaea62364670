import json

import pytest
from sparse_patterns import (
    AShape,
    BlockSparse,
    Dense,
    Grid,
    HeadConfig,
    KBoundary,
    NoBoundary,
    PatternConfig,
    QBoundary,
    SFFixed,
    SFStrided,
    TriShape,
    TwoDBoundary,
    VerticalSlash,
)

ALL = [
    HeadConfig(Dense()),
    HeadConfig(AShape(sink=128, window=1024), KBoundary()),
    HeadConfig(TriShape(sink=64, window=512, last=32)),
    HeadConfig(VerticalSlash(n_vertical=100, n_slash=200), QBoundary()),
    HeadConfig(Grid(stride=196, use_hline=True), NoBoundary()),
    HeadConfig(Grid()),
    HeadConfig(VerticalSlash(n_vertical=10, n_slash=20, exact_verticals=True)),
    HeadConfig(BlockSparse(ratio=0.25, block=128)),
    HeadConfig(SFFixed(local=196, vline_stride=196)),
    HeadConfig(SFStrided(local=196, vline_stride=196), TwoDBoundary(cross_vertical=64)),
]


def _cfg(model_id="org/model"):
    return PatternConfig(model_id, 2, 5, (tuple(ALL[:5]), tuple(ALL[5:])), {"cost_model": "x"})


def test_config_json_roundtrip_is_exact(tmp_path):
    cfg = _cfg()
    path = tmp_path / "c.json"
    cfg.save(path)
    back = PatternConfig.load(path, model_id="org/model")
    assert back == cfg
    assert back.layers[1][4].boundary == TwoDBoundary(cross_vertical=64)
    assert back.metadata == {"cost_model": "x"}


@pytest.mark.parametrize(
    "mutate, err, match",
    [
        pytest.param(
            lambda d: d.update(version=2), ValueError, "version: expected 1", id="version"
        ),
        pytest.param(lambda d: d.update(format="x"), ValueError, "format", id="format"),
        pytest.param(lambda d: d.update(model_id="other"), ValueError, "model_id", id="model"),
        pytest.param(lambda d: d.update(num_heads=4), ValueError, "expected 4 heads", id="heads"),
        pytest.param(
            lambda d: d.update(num_layers=3), ValueError, "expected 3 layers", id="layers"
        ),
        pytest.param(lambda d: d.update(extra=1), ValueError, "unknown fields", id="extra-field"),
        pytest.param(
            lambda d: d["layers"][0][1]["pattern"].update(window=0),
            ValueError,
            "AShape.window",
            id="bad-param",
        ),
        pytest.param(
            lambda d: d["layers"][0][1]["pattern"].update(kind="nope"),
            ValueError,
            r"layers\[0\]\[1\].pattern.kind",
            id="bad-kind",
        ),
        pytest.param(
            lambda d: d["layers"][0][3]["pattern"].update(n_vertical="7"),
            TypeError,
            "n_vertical: expected an int",
            id="bad-type",
        ),
        pytest.param(
            lambda d: d["layers"][0][3]["pattern"].update(colour=1),
            ValueError,
            "unknown fields",
            id="pattern-extra-field",
        ),
    ],
)
def test_config_read_errors_name_the_field(mutate, err, match):
    d = json.loads(_cfg().to_json())
    mutate(d)
    with pytest.raises(err, match=match):
        PatternConfig.from_json(json.dumps(d), model_id="org/model")


def test_config_not_json():
    with pytest.raises(ValueError, match="not valid JSON"):
        PatternConfig.from_json("{")


@pytest.mark.parametrize(
    "make, err",
    [
        pytest.param(lambda: BlockSparse(), ValueError, id="blocksparse-neither"),
        pytest.param(lambda: BlockSparse(top_k=2, ratio=0.5), ValueError, id="blocksparse-both"),
        pytest.param(lambda: BlockSparse(ratio=1.5), ValueError, id="ratio-range"),
        pytest.param(lambda: Grid(stride=0), ValueError, id="grid-stride"),
        pytest.param(lambda: Grid(use_hline=1), TypeError, id="grid-flag-type"),
        pytest.param(lambda: VerticalSlash(n_slash=0), ValueError, id="vs-slash"),
        pytest.param(lambda: VerticalSlash(exact_verticals=1), TypeError, id="vs-exact-type"),
        pytest.param(lambda: AShape(sink=True), TypeError, id="bool-not-int"),
        pytest.param(lambda: HeadConfig("dense"), TypeError, id="headconfig-type"),
    ],
)
def test_spec_validation(make, err):
    with pytest.raises(err):
        make()


def test_specs_are_frozen():
    g = Grid()
    with pytest.raises(AttributeError):
        g.stride = 4  # type: ignore[misc]
