"""Helpers to run a function on a local process group (gloo on CPU, NCCL on GPU) from a test.

``spawn(target, world_size, **kwargs)`` starts ``world_size`` processes with
``torch.multiprocessing``, each calling ``target(rank, world_size, **kwargs)`` inside an initialised
process group, and returns the per-rank return values (``torch.save``-able). A rank that raises
makes ``spawn`` raise ``SpawnError`` with that rank's traceback; the whole run is bounded by
``timeout_s`` (stragglers are terminated). ``target`` must be importable (defined at module level
of an importable module), not a test-file function.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class SpawnError(RuntimeError):
    """A spawned rank failed or the run exceeded its time bound."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, backend, pg_timeout_s, target, kwargs, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    path = os.path.join(out_dir, f"rank{rank}.pt")
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout_s)
        )
        result = target(rank, world_size, **kwargs)
        torch.save({"ok": True, "result": result}, path)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, then re-raised
        torch.save(
            {"ok": False, "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()}, path
        )
        raise
    finally:
        if dist.is_initialized():
            # the group may be broken by a failed peer
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def spawn(
    target,
    world_size: int,
    *,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    pg_timeout_s: float = 60.0,
    **kwargs,
) -> list:
    """Run ``target`` on ``world_size`` ranks; return the per-rank results (rank order)."""
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [
            ctx.Process(
                target=_entry,
                args=(r, world_size, port, backend, pg_timeout_s, target, kwargs, out_dir),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
        reports = []
        for r in range(world_size):
            path = os.path.join(out_dir, f"rank{r}.pt")
            reports.append(torch.load(path, weights_only=False) if os.path.exists(path) else None)
    errors = [
        f"rank {r}: {rep['error']}\n{rep['tb']}"
        for r, rep in enumerate(reports)
        if rep is not None and not rep["ok"]
    ]
    if hung:
        errors.append(f"ranks {hung} still running after {timeout_s:.0f} s (terminated)")
    missing = [r for r, rep in enumerate(reports) if rep is None and r not in hung]
    if missing:
        errors.append(f"ranks {missing} exited without a result")
    if errors:
        raise SpawnError("\n".join(errors))
    return [rep["result"] for rep in reports]


# ---- workers shared by the CPU (gloo) and GPU (NCCL) tests -------------------------------------


def make_full_qkv(case: dict, device="cpu"):
    """Seeded full-sequence q/k/v ``[B, H, n, D]`` / ``[B, H_KV, n, D]`` for an attention case."""
    g = torch.Generator().manual_seed(case["seed"])
    B, H, H_KV, n, D = case["B"], case["H"], case["H_KV"], case["n"], case["D"]
    dtype = getattr(torch, case.get("dtype", "float32"))

    def rnd(h):
        return torch.randn(B, h, n, D, generator=g).to(device=device, dtype=dtype)

    return rnd(H), rnd(H_KV), rnd(H_KV)


def case_layout(case: dict, world_size: int):
    """``(layout, config)`` of an attention case (method spava / star / apb / ring)."""
    from .config import SpavaConfig, apb_config, resolve_apb, star_config
    from .layout import build_layout, ring_layout

    method, n = case["method"], case["n"]
    if method == "ring":
        return ring_layout(n, num_hosts=world_size), None
    if method == "star":
        cfg = star_config(world_size, anchor_len=case.get("anchor_len"))
    elif method == "apb":
        cfg = resolve_apb(apb_config(world_size, anchor_len=case.get("anchor_len")), n)
    else:
        cfg = SpavaConfig(
            num_hosts=world_size,
            anchor_len=case.get("anchor_len"),
            passing_len=case.get("passing_len"),
            zigzag=case.get("zigzag", True),
            overlap_comm=case.get("overlap_comm", True),
        )
    return build_layout(n, query_len=case.get("query_len", 0), config=cfg), cfg


def attention_cases(rank: int, world_size: int, *, cases: list[dict], device: str = "cpu"):
    """Worker: run every case's distributed attention on this rank's shard; return local outputs."""
    from .baselines import zigzag_ring_attention
    from .spava import spava_attention
    from .testing_hosts import case_host_attention

    if device == "cuda":
        device = f"cuda:{rank}"
    results = []
    for case in cases:
        layout, cfg = case_layout(case, world_size)
        q, k, v = (layout.shard(t, rank, dim=2) for t in make_full_qkv(case, device))
        if case["method"] == "ring":
            r = zigzag_ring_attention(
                q,
                k,
                v,
                layout,
                comm=case.get("comm", "ring"),
                overlap_comm=case.get("overlap_comm", True),
            )
        else:
            r = spava_attention(q, k, v, layout, cfg, host_attention=case_host_attention(case))
        results.append((r.out.cpu(), r.lse.cpu()))
    return results


def fault_worker(
    rank: int, world_size: int, *, mode: str, fail_rank: int, stall_s: float, report_dir: str
):
    """Worker for the fault tests: a loop of all-gathers; ``fail_rank`` raises or sleeps at step 3."""
    from .faults import Watchdog

    def on_abort(text: str) -> None:
        with open(os.path.join(report_dir, f"abort{rank}.txt"), "w") as f:
            f.write(text)

    x = torch.ones(4)
    with Watchdog(timeout_s=stall_s, interval_s=0.2, on_abort=on_abort) as wd:
        for step in range(20):
            if rank == fail_rank and step == 3:
                if mode == "raise":
                    raise ValueError("injected failure")
                time.sleep(3600)
            out = [torch.empty_like(x) for _ in range(world_size)]
            dist.all_gather(out, x)
            wd.beat(f"step {step}")
    return step


def synthetic_video_inputs(
    config, *, t: int, h: int, w: int, prefix: int, question: int, seed: int
):
    """Processor-shaped Qwen2.5-VL inputs for a random video of ``t`` temporal groups of ``h x w``
    patches: ``prefix`` text tokens, the video, ``question`` text tokens. Returns
    ``(inputs, query_len)``."""
    g = torch.Generator().manual_seed(seed)
    vc = config.vision_config
    n_vid = t * h * w // vc.spatial_merge_size**2
    text = lambda n: torch.randint(100, 1000, (n,), generator=g)  # noqa: E731
    ids = torch.cat(
        [
            text(prefix),
            torch.tensor([config.vision_start_token_id]),
            torch.full((n_vid,), config.video_token_id),
            torch.tensor([config.vision_end_token_id]),
            text(question),
        ]
    )[None]
    patch = 3 * vc.temporal_patch_size * vc.patch_size**2
    inputs = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "pixel_values_videos": torch.randn(t * h * w, patch, generator=g),
        "video_grid_thw": torch.tensor([[t, h, w]]),
        "mm_token_type_ids": (ids == config.video_token_id).int() * 2,
    }
    return inputs, question


def build_tiny_model(kind: str, seed: int):
    from .integrations.hf import _transformers, tiny_llama_config, tiny_qwen2_5_vl_config

    transformers = _transformers()

    torch.manual_seed(seed)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(tiny_llama_config())
    elif kind == "qwen2_5_vl":
        model = transformers.Qwen2_5_VLForConditionalGeneration(tiny_qwen2_5_vl_config())
    else:
        raise ValueError(f"kind: expected 'llama' or 'qwen2_5_vl', got {kind!r}")
    return model.eval()


def model_inputs(kind: str, model, *, n: int, query_len: int, seed: int):
    """``(inputs, query_len)`` of a tiny model case (llama: random ids of length n)."""
    if kind == "llama":
        g = torch.Generator().manual_seed(seed)
        return {
            "input_ids": torch.randint(0, model.config.vocab_size, (1, n), generator=g)
        }, query_len
    t = max(2, (n - query_len - 4) // 4)
    return synthetic_video_inputs(
        model.config, t=t, h=4, w=4, prefix=3, question=query_len, seed=seed
    )


def hf_worker(rank: int, world_size: int, *, runs: list[dict]):
    """Worker: for each run build the tiny model and generate sharded; return tokens + logits."""
    from .config import SpavaConfig
    from .integrations.hf import sharded_generate
    from .testing_hosts import model_sparsity

    out = []
    for run in runs:
        model = build_tiny_model(run["kind"], run["seed"])
        inputs, nq = model_inputs(
            run["kind"], model, n=run["n"], query_len=run["query_len"], seed=run["seed"]
        )
        cfg = None
        if run.get("config"):
            cfg = SpavaConfig(num_hosts=world_size, **run["config"])
        solo = run.get("rank0_alone", False)  # a single-process run inside the group: no collective
        if solo and rank != 0:
            out.append((None, None))
            continue
        r = sharded_generate(
            model,
            inputs,
            query_len=nq,
            method=run["method"],
            config=cfg,
            max_new_tokens=run.get("new", 4),
            simulate_hosts=1 if solo else None,
            sparsity=model_sparsity(
                run.get("sparse"), model, start_layer=run.get("start_layer", 1)
            ),
        )
        out.append((r.tokens, r.first_logits))
    return out
