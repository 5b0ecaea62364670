"""`vlm-accel probe` writes TriangleMix's gradient probe result beside a checkpoint's config;
run and bench take the start layer from --start-layer, else that result, else half the layers
(with a note). Checked on a saved tiny Qwen2-VL with the offline byte-level tokenizer."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("transformers")
from modality_index.integrations import hf  # noqa: E402
from triangle_mix import ProbeResult, suggest_start_layer  # noqa: E402
from vlm_accel import models  # noqa: E402
from vlm_accel.cli import PROBE_FILE, main  # noqa: E402
from vlm_accel.errors import EXIT_INPUT, EXIT_OK  # noqa: E402

CLIP = str(hf.sample_clip_path())
PROBE = ["--samples", "1", "--tokens", "400", "--device", "cpu", "--dtype", "float32"]


@pytest.fixture
def checkpoint(tmp_path):
    """A saved tiny Qwen2-VL (2 layers) with its tokenizer, in a directory named ``ckpt``."""
    d = tmp_path / "ckpt"
    models.tiny_model("qwen2_vl", seed=1).save_pretrained(d)
    hf.tiny_tokenizer().save_pretrained(d)
    return d


def _run_trianglemix(d, *extra):
    # 24 frames at 224 x 224: 864 tokens, where a triangle layer of the CLI's shape drops keys
    return main(["run", "--model", str(d), "--video", CLIP, "--prompt", "What happens?",
                 "--frames", "24", "--max-pixels", "50176", "--device", "cpu",
                 "--dtype", "float32", "--method", "trianglemix", "--max-new-tokens", "1",
                 *extra])  # fmt: skip


def test_probe_writes_beside_the_config_and_run_reads_it(checkpoint, capsys, method_calls):
    assert main(["probe", "--model", str(checkpoint), *PROBE]) == EXIT_OK
    path = checkpoint / PROBE_FILE
    result = ProbeResult.from_json(path.read_text())
    assert result.model_id == "ckpt" and len(result.grad_middle) == 2
    assert result.suggested_start_layer == suggest_start_layer(result.grad_middle, 0.1)
    assert f"wrote {path}: TriangleMix start layer {result.suggested_start_layer} of 2" in (
        capsys.readouterr().out
    )
    # A start layer of 0 (every layer triangle) tells the stored result from half the layers.
    path.write_text(dataclasses.replace(result, suggested_start_layer=0).to_json())
    method_calls.reset()
    assert _run_trianglemix(checkpoint) == EXIT_OK
    method_calls.assert_ran("triangle", calls=2 * 2)  # layers 0 and 1, timed and generate
    assert len(method_calls.lengths["triangle"]) == 2 * 2
    assert "note: TriangleMix" not in capsys.readouterr().err
    # --start-layer wins over the stored result
    method_calls.reset()
    assert _run_trianglemix(checkpoint, "--start-layer", "1") == EXIT_OK
    assert len(method_calls.lengths["triangle"]) == 1 * 2


def test_probe_file_given_with_probe_and_the_default_without_one(
    checkpoint, tmp_path, capsys, method_calls
):
    elsewhere = tmp_path / "probe.json"
    result = ProbeResult((1.0, 0.0), (0.0, 0.0), (0.1, 0.1), (0.1, 0.1), 0, 0.1, 1, 400, 64, 128,
                         128, model_id="ckpt")  # fmt: skip
    elsewhere.write_text(result.to_json())
    assert _run_trianglemix(checkpoint, "--probe", str(elsewhere)) == EXIT_OK
    assert len(method_calls.lengths["triangle"]) == 2 * 2
    method_calls.reset()
    capsys.readouterr()
    assert _run_trianglemix(checkpoint) == EXIT_OK  # no probe result: half the layers
    assert len(method_calls.lengths["triangle"]) == 1 * 2
    err = capsys.readouterr().err
    assert (
        "note: TriangleMix from layer 1 of 2 (half the layers): no --start-layer and no probe "
        f"result; `vlm-accel probe --model {checkpoint}` measures one" in err
    )


def _probe_json(**change) -> str:
    base = ProbeResult((1.0, 0.0), (0.0, 0.0), (0.1, 0.1), (0.1, 0.1), 1, 0.1, 1, 400, 64, 128,
                       128, model_id="ckpt")  # fmt: skip
    return dataclasses.replace(base, **change).to_json()


@pytest.mark.parametrize(
    "text, names",
    [
        pytest.param("{not json", ["is not a valid probe result", "invalid JSON"], id="not-json"),
        pytest.param(json.dumps({"grad_middle": [1.0]}), ["is not a valid probe result",
                     "expected the ProbeResult fields"], id="missing-fields"),
        pytest.param(_probe_json(grad_middle=(1.0, 0.0, 0.0), grad_last=(0.0,) * 3,
                                 att_middle=(0.1,) * 3, att_last=(0.1,) * 3),
                     ["expected a probe result of 'ckpt' (2 layers)", "of 'ckpt' (3 layers)"],
                     id="other-layer-count"),
        pytest.param(_probe_json(model_id="Qwen2-VL-72B"),
                     ["expected a probe result of 'ckpt' (2 layers)", "of 'Qwen2-VL-72B' (2 layers)"],
                     id="other-model"),
        pytest.param(_probe_json(suggested_start_layer=5),
                     ["suggested_start_layer: expected 0..2", "got 5"], id="start-past-the-end"),
    ],
)  # fmt: skip
def test_bad_probe_file_exits_3_before_the_model_loads(
    text, names, checkpoint, capsys, monkeypatch
):
    from vlm_accel import engine

    loads = []
    monkeypatch.setattr(engine, "load_model", lambda *a, **kw: loads.append(a))
    (checkpoint / PROBE_FILE).write_text(text)
    assert _run_trianglemix(checkpoint) == EXIT_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("vlm-accel: error: --probe: "), err
    assert all(n in err for n in names), err
    assert loads == []


def test_missing_probe_file_and_probe_of_the_tiny_model(tmp_path, capsys):
    argv = ["run", "--model", "tiny", "--video", CLIP, "--prompt", "q", "--device", "cpu",
            "--method", "trianglemix", "--probe", str(tmp_path / "none.json")]  # fmt: skip
    assert main(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "--probe: expected a probe result JSON file, got" in err and "none.json" in err
    assert main(["probe", "--model", "tiny"]) == EXIT_INPUT
    err = capsys.readouterr().err.strip()
    assert err == (
        "vlm-accel: error: --model: expected a checkpoint directory with a tokenizer, got "
        "'tiny' (the tiny random model has no tokenizer, and the probe's prompts are text)"
    )
    assert not list(tmp_path.iterdir())
