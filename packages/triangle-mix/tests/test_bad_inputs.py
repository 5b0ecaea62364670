"""Hostile LayerPolicy input: refused with a ValueError/TypeError naming what it must be and
what came; never taken for its truth value, never a RecursionError or MemoryError."""

import json

import pytest
from triangle_mix import LayerPolicy


def _json(**over) -> str:
    return json.dumps({**json.loads(LayerPolicy(("dense",)).to_json()), **over})


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: LayerPolicy(None), TypeError, r"kinds: expected a tuple or list of kind names, got NoneType"),
        (lambda: LayerPolicy("dense"), TypeError, r"kinds: expected a tuple or list of kind names, got str"),
        (lambda: LayerPolicy([["dense"]]), ValueError, r"kinds: expected each of .*, got \[\['dense'\]\]"),
        (lambda: LayerPolicy(("dense",), last_row_only="no"), TypeError, r"last_row_only: expected a bool, got str"),
        (lambda: LayerPolicy.dense(10**12), ValueError, r"num_layers: expected an int in \[1, 65536\], got 1000000000000"),
        (lambda: LayerPolicy.triangle_from(4, 1.5), TypeError, r"start_layer: expected an int, got float"),
        (lambda: LayerPolicy.triangle_from(4, "1"), TypeError, r"start_layer: expected an int, got str"),
        (lambda: LayerPolicy.triangle_from(4, True), TypeError, r"start_layer: expected an int, got bool"),
    ],
    ids=["kinds-None", "kinds-str", "kinds-nested", "last_row_only-str", "layers-huge",
         "start-float", "start-str", "start-bool"],
)  # fmt: skip
def test_constructors(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


@pytest.mark.parametrize(
    "text, exc, match",
    [
        ("[" * 100_000 + "]" * 100_000, ValueError, r"not valid JSON \(RecursionError"),
        ('{"version": 1, "sink": ' + "9" * 5000 + "}", ValueError, r"not valid JSON \(ValueError: Exceeds the limit"),
        (_json(kinds=5), TypeError, r"kinds: expected a list, got int"),
        (_json(kinds="dense"), TypeError, r"kinds: expected a list, got str"),
        (_json(last_row_only=1), TypeError, r"last_row_only: expected a bool, got int"),
        (b"{}", TypeError, r"LayerPolicy JSON: expected a str, got bytes"),
    ],
    ids=["nested-deep", "int-digits", "kinds-int", "kinds-str", "last_row_only-int", "bytes"],
)  # fmt: skip
def test_from_json(text, exc, match):
    with pytest.raises(exc, match=match):
        LayerPolicy.from_json(text)
