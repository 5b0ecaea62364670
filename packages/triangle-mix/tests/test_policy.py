import pytest
from triangle_mix import LayerPolicy


def test_constructors_and_start_layer():
    p = LayerPolicy.triangle_from(6, 4)
    assert p.kinds == ("dense",) * 4 + ("triangle",) * 2
    assert p.start_layer == 4 and (p.sink, p.window, p.last) == (8, 512, 128)
    assert LayerPolicy.dense(3).start_layer is None
    assert LayerPolicy.triangle_everywhere(2).kinds == ("triangle", "triangle")
    assert LayerPolicy.streaming_everywhere(2).kinds == ("streaming", "streaming")
    assert LayerPolicy.triangle_from(3, 1, shallow="dynamic").needs_dynamic


def test_json_round_trip():
    p = LayerPolicy.triangle_from(5, 2, sink=4, window=64, last=32)
    p2 = LayerPolicy(p.kinds, sink=4, window=64, last=32, last_row_only=True)
    for x in (p, p2):
        assert LayerPolicy.from_json(x.to_json()) == x


@pytest.mark.parametrize(
    "text,match",
    [
        ('{"version": 99, "kinds": ["dense"]}', "version"),
        ("not json", "not valid JSON"),
        ('{"version": 1, "kinds": ["dense"], "foo": 1}', "unknown fields"),
        ('{"version": 1, "kinds": ["sparse"]}', "kinds"),
        ('{"version": 1, "kinds": ["dense"], "window": 0}', "window"),
    ],
)
def test_bad_json(text, match):
    with pytest.raises(ValueError, match=match):
        LayerPolicy.from_json(text)


def test_bad_constructor_args():
    with pytest.raises(ValueError, match="start_layer"):
        LayerPolicy.triangle_from(4, 5)
    with pytest.raises(ValueError, match="num_layers"):
        LayerPolicy.dense(0)
    with pytest.raises(ValueError, match="shallow"):
        LayerPolicy.triangle_from(4, 1, shallow="triangle")
