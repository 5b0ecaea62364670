"""Qwen2-VL and LLaVA-OneVision through vlm-accel: tiny random checkpoints saved to a directory
(model + the offline tokenizer; transformers' video processors need torchvision, so the inputs
are built by hand in the processor's layout), run from the CLI, the layout reaching every
layer's attention, and the dense policy reproducing the unpatched logits exactly."""

import json

import pytest
import torch

pytest.importorskip("transformers")
from modality_index import Modality  # noqa: E402
from modality_index.integrations import hf  # noqa: E402
from vlm_accel import engine, models  # noqa: E402
from vlm_accel.cli import main  # noqa: E402
from vlm_accel.errors import EXIT_INPUT, EXIT_OK, CliError  # noqa: E402

CLIP = str(hf.sample_clip_path())
FAMILIES = [
    pytest.param("qwen2_vl", id="qwen2-vl"),
    pytest.param("llava_onevision", id="llava-onevision"),
]
BUILDERS = {"qwen2_vl": hf.tiny_qwen2_vl_config, "llava_onevision": hf.tiny_llava_onevision_config}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One saved tiny checkpoint per family: weights, config and the byte-level tokenizer."""
    dirs = {}
    for mt in BUILDERS:
        d = tmp_path_factory.mktemp(mt)
        models.tiny_model(mt, seed=1).save_pretrained(d)
        hf.tiny_tokenizer().save_pretrained(d)
        dirs[mt] = d
    return dirs


# Frames and pixels per frame giving each family's tiny model a prompt long enough for every
# method to differ from dense (conftest.MethodCalls.APPLIES_FROM): 864 and 681 tokens.
LONG = {"qwen2_vl": (24, 224 * 224), "llava_onevision": (72, 12544)}


def _argv(d, *extra, frames=4, max_pixels=12544):
    return ["run", "--model", str(d), "--video", CLIP, "--prompt", "What happens?",
            "--frames", str(frames), "--max-pixels", str(max_pixels),
            "--device", "cpu", "--dtype", "float32", *extra]  # fmt: skip


def _long_argv(mt, d, *extra):
    frames, max_pixels = LONG[mt]
    return _argv(d, *extra, frames=frames, max_pixels=max_pixels)


def _load(d, frames=4, max_pixels=12544):
    model, tok = engine.load_model(d, device="cpu", dtype=torch.float32)
    inputs, layout = engine.video_inputs(
        model, tok, CLIP, "What happens?", frames=frames, max_pixels=max_pixels
    )
    return model, tok, inputs, layout


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


@pytest.mark.parametrize("mt", FAMILIES)
def test_packaged_tiny_config_is_the_builders(mt):
    got = models.tiny_config(mt).to_dict()
    want = BUILDERS[mt]().to_dict()
    got.pop("transformers_version", None), want.pop("transformers_version", None)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.mark.parametrize("mt", FAMILIES)
def test_run_from_a_saved_checkpoint(mt, checkpoints, capsys, method_calls):
    per_frame = {"qwen2_vl": None, "llava_onevision": 9}[mt]
    argv = _long_argv(mt, checkpoints[mt], "--method", "trianglemix", "--start-layer", "1",
                      "--max-new-tokens", "2")  # fmt: skip
    assert main(argv) == EXIT_OK
    method_calls.assert_ran("triangle", calls=2)  # layer 1, timed and generate's prefill
    cap = capsys.readouterr()
    assert "method: trianglemix" in cap.out and "generated: 2" in cap.out
    assert main(_argv(checkpoints[mt], "--max-new-tokens", "2")) == EXIT_OK
    cap = capsys.readouterr()
    assert "answer: " in cap.out and "method: dense" in cap.out and "generated: 2" in cap.out
    assert "token ids" not in cap.out  # decoded with the checkpoint's tokenizer
    assert "building the video inputs by hand" in cap.err
    video = int(cap.out.split("(video ")[1].split(",")[0])
    if per_frame is not None:  # 4 pooled frames + the newline token
        assert video == 4 * per_frame + 1
    else:  # 4 frames -> 2 temporal groups of (h/2 x w/2) merged patches
        _, _, inputs, layout = _load(checkpoints[mt])
        t, h, w = inputs["video_grid_thw"][0].tolist()
        assert video == t * h * w // 4 and t == 2


@pytest.mark.parametrize("mt", FAMILIES)
def test_search_then_run_mminference(mt, checkpoints, tmp_path, method_calls):
    """search on a short clip; its config drives mminference at a length where the patterns
    apply, and mminference+trianglemix (layer 0 MMInference, layer 1 triangle)."""
    cfg = tmp_path / "cfg.json"
    base = _argv(checkpoints[mt])[1:]
    assert main(["search", *base, "--out", str(cfg)]) == EXIT_OK
    assert json.loads(cfg.read_text())["num_layers"] == 2
    method_calls.reset()
    argv = [*_long_argv(mt, checkpoints[mt]), "--config", str(cfg), "--max-new-tokens", "1"]
    assert main([*argv, "--method", "mminference"]) == EXIT_OK
    method_calls.assert_ran("mminference", calls=2 * 2)  # 2 layers, timed and generate's prefill
    method_calls.reset()
    argv = [*argv, "--method", "mminference+trianglemix", "--start-layer", "1"]
    assert main(argv) == EXIT_OK
    method_calls.assert_ran("mminference", calls=2)
    method_calls.assert_ran("triangle", calls=2)


@pytest.mark.parametrize("mt", FAMILIES)
def test_dense_policies_equal_unpatched_exactly(mt, checkpoints, assert_dense_methods_exact):
    model, _, inputs, layout = _load(checkpoints[mt])
    assert_dense_methods_exact(model, inputs, layout, mt)


@pytest.mark.parametrize("mt", FAMILIES)
def test_triangle_layers_really_run(mt, checkpoints):
    """A narrow triangle from layer 0 changes the logits: the language model's attention goes
    through the registered function in this family (not the vision tower's, not skipped)."""
    model, _, inputs, layout = _load(checkpoints[mt])
    ref = _logits(model, inputs)
    applied = engine.apply_method(
        model, "trianglemix", layout=layout, start_layer=0, sink=2, window=4, last=2
    )
    try:
        got = _logits(model, inputs)
    finally:
        applied.remove()
    assert (got - ref).abs().max() > 1e-3
    assert torch.equal(_logits(model, inputs), ref)


@pytest.mark.parametrize("mt", FAMILIES)
def test_layout_reaches_every_layer(mt, checkpoints, monkeypatch):
    """With --method mminference every language-model layer's attention receives this input's
    ModalityLayout (frames and tokens per frame of this family), long enough (>= 256 tokens)
    for the sparse path."""
    import sparse_patterns.mminference as mm
    from sparse_patterns import Dense, HeadConfig, PatternConfig

    frames, max_pixels = {"qwen2_vl": (8, 224 * 224), "llava_onevision": (30, 12544)}[mt]
    model, _, inputs, layout = _load(checkpoints[mt], frames=frames, max_pixels=max_pixels)
    assert layout.seq_len >= 256
    if mt == "llava_onevision":
        want = (Modality.VIDEO, 9, frames, frames * 9 + 1)
    else:
        t, h, w = inputs["video_grid_thw"][0].tolist()
        want = (Modality.VIDEO, h * w // 4, t, t * h * w // 4)
    (item,) = layout.items
    assert (item.modality, item.tokens_per_frame, item.num_frames, item.length) == want
    assert int((inputs["input_ids"] == model.config.video_token_id).sum()) == want[3]

    seen, real = [], mm.mminference_attention

    def spy(q, k, v, head_config, layout=None, **kw):
        seen.append((q.shape[2], layout))
        return real(q, k, v, head_config, layout, **kw)

    monkeypatch.setattr(mm, "mminference_attention", spy)
    lm = engine.language_model(model)
    n, H = lm.config.num_hidden_layers, lm.config.num_attention_heads
    cfg = PatternConfig(mt, n, H, ((HeadConfig(Dense()),) * H,) * n, {})
    applied = engine.apply_method(model, "mminference", layout=layout, pattern_config=cfg)
    try:
        _logits(model, inputs)
    finally:
        applied.remove()
    assert len(seen) == n
    assert all(layout.seq_len == S and lay is layout for S, lay in seen)


def test_unsupported_model_type_is_one_line(tmp_path, capsys):
    import transformers

    transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)
    assert main(["run", "--model", str(tmp_path), "--video", CLIP, "--prompt", "q"]) == EXIT_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert (
        "model type 'gpt2' is not supported (supported: qwen2_5_vl, qwen2_vl, llava_onevision)"
        in err
    )


def test_checkpoint_without_processor_or_tokenizer(tmp_path):
    models.tiny_model("llava_onevision").save_pretrained(tmp_path)
    with pytest.raises(CliError, match="has no usable processor"):
        engine.load_model(tmp_path, device="cpu", dtype=torch.float32)


# The structure of llava-hf's LLaVA-OneVision chat template (role, a space, the video token,
# then each text after a newline; no newline after <|im_end|>), written for the tiny tokenizer.
_LLAVA_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + ' ' }}"
    "{% for c in m['content'] if c['type'] == 'video' %}{{ '<video>' }}{% endfor %}"
    "{% for c in m['content'] if c['type'] == 'text' %}{{ '\n' + c['text'] }}{% endfor %}"
    "{{ '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_QWEN_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% for c in m['content'] %}{% if c['type'] == 'video' %}"
    "{{ '<|vision_start|><|video_pad|><|vision_end|>' }}{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _real_processor(mt):
    import transformers as tf

    tok = hf.tiny_tokenizer()
    if mt == "llava_onevision":
        sq = {"height": 70, "width": 70}
        return tf.LlavaOnevisionProcessor(
            image_processor=tf.LlavaOnevisionImageProcessor(
                size=sq, crop_size=sq, image_grid_pinpoints=[[70, 70]]
            ),
            tokenizer=tok,
            video_processor=tf.LlavaOnevisionVideoProcessor(size=sq),
            num_image_tokens=25,
            vision_feature_select_strategy="full",
            chat_template=_LLAVA_TEMPLATE,
        )
    edge = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}
    return tf.Qwen2VLProcessor(
        image_processor=tf.Qwen2VLImageProcessor(size=edge),
        tokenizer=tok,
        video_processor=tf.Qwen2VLVideoProcessor(size=edge),
        chat_template=_QWEN_TEMPLATE,
    )


@pytest.mark.parametrize("mt", FAMILIES)
def test_real_processor_path(mt, tmp_path, capsys):
    """Where torchvision is installed: a checkpoint saved with a real processor runs through the
    processor (no hand-built note), and for LLaVA-OneVision the hand-built token ids equal the
    processor's."""
    pytest.importorskip("torchvision")
    models.tiny_model(mt, seed=1).save_pretrained(tmp_path)
    _real_processor(mt).save_pretrained(tmp_path)
    assert main([*_argv(tmp_path), "--max-new-tokens", "2"]) == EXIT_OK
    assert "by hand" not in capsys.readouterr().err
    model, proc, inputs, layout = _load(tmp_path)
    assert engine.is_processor(proc)
    vid = int((inputs["input_ids"] == model.config.video_token_id).sum())
    assert vid == layout.counts()[Modality.VIDEO] > 0
    if mt == "llava_onevision":
        clip = hf.decode_video(CLIP, 4)
        hand, _ = hf.build_llava_onevision_inputs(
            model.config, clip, "What happens?", tokenizer=proc.tokenizer
        )
        assert torch.equal(hand["input_ids"], inputs["input_ids"])
        diff = (hand["pixel_values_videos"] - inputs["pixel_values_videos"].float()).abs()
        assert float(diff.max()) < 0.035


@pytest.mark.gpu
@pytest.mark.parametrize("mt", FAMILIES)
def test_cuda_bf16_accelerated_methods(mt, checkpoints, tmp_path, capsys, method_calls):
    """On a GPU: search, then trianglemix and mminference+trianglemix through the Triton
    kernels in bf16, from the saved tiny checkpoint, with and without ``--fused``, at a length
    where both methods apply."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cuda = ["--device", "cuda", "--dtype", "bfloat16"]
    base = [*_long_argv(mt, checkpoints[mt])[1:-4], *cuda]
    cfg = tmp_path / "cfg.json"
    assert main(["search", *base, "--out", str(cfg)]) == EXIT_OK
    for method in ("trianglemix", "mminference+trianglemix"):
        argv = ["run", *base, "--method", method, "--config", str(cfg), "--start-layer", "1"]
        for fused in ([], ["--fused"]):  # the fused norms, MLP gates and rotary step (Triton)
            method_calls.reset()
            assert main([*argv, "--max-new-tokens", "2", *fused]) == EXIT_OK, method
            assert f"method: {method}" in capsys.readouterr().out
            method_calls.assert_ran("triangle", calls=2)
            if method != "trianglemix":
                method_calls.assert_ran("mminference", calls=2)


@pytest.mark.parametrize("mt", FAMILIES)
def test_show_and_bench(mt, checkpoints, tmp_path, method_calls):
    base = _argv(checkpoints[mt])[1:]
    png = tmp_path / "head.png"
    assert main(["show", *base, "--layer", "1", "--head", "3", "--out", str(png)]) == EXIT_OK
    assert png.stat().st_size > 1000
    stem = tmp_path / "bench"
    argv = ["bench", *_long_argv(mt, checkpoints[mt])[1:], "--methods", "dense,trianglemix"]
    assert main([*argv, "--start-layer", "0", "--repeat", "1", "--out", str(stem)]) == EXIT_OK
    rows = json.loads(stem.with_suffix(".json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["dense", "trianglemix"]
    method_calls.assert_ran("triangle", calls=2 * 2)  # warm-up and 1 run, layers 0 and 1
