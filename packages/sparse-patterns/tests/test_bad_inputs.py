"""Hostile PatternConfig input: every case is refused by the loader with a ValueError/TypeError
that names the field, what it must be and what came."""

import json

import pytest
from sparse_patterns import Grid, HeadConfig, PatternConfig, TwoDBoundary, VerticalSlash


def _cfg() -> PatternConfig:
    return PatternConfig(
        "org/model",
        1,
        2,
        ((HeadConfig(Grid(stride=4)), HeadConfig(VerticalSlash(), TwoDBoundary())),),
        {"cost_model": "x"},
    )


def _load(mutate):
    d = json.loads(_cfg().to_json())
    mutate(d)
    return PatternConfig.from_json(json.dumps(d))


def _grid(**kw):
    return lambda d: d["layers"][0][0]["pattern"].update(**kw)


@pytest.mark.parametrize(
    "mutate, err, expected, received",
    [
        pytest.param(
            _grid(stride=10**30),
            ValueError,
            "Grid.stride: expected an int in [1, 2147483647]",
            "got int 1000000000000000000000000000000",
            id="grid-stride-1e30",
        ),
        pytest.param(
            _grid(stride=-3), ValueError, "Grid.stride: expected an int in [1,", "-3", id="neg"
        ),
        pytest.param(
            _grid(stride=True), TypeError, "Grid.stride: expected an int", "bool True", id="bool"
        ),
        pytest.param(
            _grid(stride=4.0), TypeError, "Grid.stride: expected an int", "float 4.0", id="float"
        ),
        pytest.param(
            _grid(max_stride=2**31), ValueError, "Grid.max_stride: expected", "2147483648", id="max"
        ),
        pytest.param(
            lambda d: d["layers"][0][1]["boundary"].update(cross_vertical=10**40),
            ValueError,
            "layers[0][1].boundary: TwoDBoundary.cross_vertical: expected an int in [0,",
            "10000000000",
            id="boundary-huge",
        ),
        pytest.param(
            lambda d: d["layers"][0][1]["pattern"].update(n_vertical=[1]),
            TypeError,
            "layers[0][1].pattern: VerticalSlash.n_vertical: expected an int",
            "list [1]",
            id="list-for-int",
        ),
        pytest.param(
            lambda d: d.update(metadata=[1]),
            TypeError,
            "metadata: expected a JSON object",
            "got list [1]",
            id="metadata-list",
        ),
        pytest.param(
            lambda d: d.update(num_heads=10**30),
            ValueError,
            "num_heads: expected an int in [1,",
            "1000000000000000000000000000000",
            id="num-heads-huge",
        ),
        pytest.param(
            lambda d: d.update(num_layers=1.0),
            TypeError,
            "num_layers: expected an int",
            "float 1.0",
            id="num-layers-float",
        ),
        pytest.param(
            lambda d: d.update(version=True),
            ValueError,
            "version: expected 1",
            "bool True",
            id="version-bool",
        ),
        pytest.param(
            lambda d: d["layers"][0][0]["pattern"].update(kind=["grid"]),
            ValueError,
            "layers[0][0].pattern.kind: expected one of",
            "list ['grid']",
            id="kind-unhashable",
        ),
        pytest.param(
            lambda d: d["layers"][0].__setitem__(0, {"pattern": {"kind": "sf_fixed", "local": 4}}),
            ValueError,
            "layers[0][0].pattern (sf_fixed): missing fields",
            "['vline_stride']",
            id="missing-required",
        ),
    ],
)
def test_loader_rejects_with_expected_and_received(mutate, err, expected, received):
    with pytest.raises(err) as ei:
        _load(mutate)
    msg = str(ei.value)
    assert expected in msg and received in msg, msg
    assert "\n" not in msg


def test_deeply_nested_json_is_a_value_error_not_recursion():
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ValueError, match="expected JSON nested at most 64 levels deep"):
        PatternConfig.from_json(text)
    nested_metadata = _cfg().to_json().replace('"metadata": {', '"metadata": {"x": ' + "[" * 5000)
    nested_metadata = nested_metadata.replace('"x"}', '"x"' + "]" * 5000 + "}")
    with pytest.raises(ValueError, match="nested at most 64"):
        PatternConfig.from_json(nested_metadata)
    # brackets inside strings are not nesting
    d = json.loads(_cfg().to_json())
    d["metadata"]["note"] = "[" * 500 + '\\"{' * 100
    back = PatternConfig.from_json(json.dumps(d))
    assert back.metadata["note"] == d["metadata"]["note"]


def test_integer_past_the_digit_limit_is_a_clear_value_error():
    text = _cfg().to_json().replace('"stride": 4', '"stride": ' + "9" * 5000)
    with pytest.raises(ValueError, match=r"PatternConfig: not valid JSON \(Exceeds the limit"):
        PatternConfig.from_json(text)


def test_duplicate_key_is_refused():
    text = _cfg().to_json().replace('"stride": 4', '"stride": 4, "stride": 8')
    with pytest.raises(ValueError, match="expected each key once per JSON object, got 'stride'"):
        PatternConfig.from_json(text)


def test_constructor_rejects_metadata_list_and_huge_stride():
    with pytest.raises(TypeError, match=r"metadata: expected a dict .* got list \[1\]"):
        PatternConfig("m", 1, 1, ((HeadConfig(Grid()),),), [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got an int of about 301 digits"):
        Grid(stride=10**300)
