"""A-shape at 32K/128K: synced per-call wall (the suite's way), back-to-back GPU time, host time per
call, for ours-auto, its parts (FA4 window, sink merge) and MInference streaming_forward."""
import time, json, os, sys
import torch
from sparse_kernels import a_shape_attention
from sparse_kernels.benchmark_providers import qwen_inputs, minference_streaming_call
from sparse_kernels.fa4.engine import _bshd
from sparse_kernels.triangle.sink_merge_triton import _launch_sink_merge_fwd
from flash_attn.cute import flash_attn_func

def synced(fn, n=30):
    for _ in range(5): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e3

def b2b(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # keep the GPU busy first so every launch is queued ahead of the GPU
    a = torch.empty(16384, 16384, device="cuda", dtype=torch.bfloat16)
    for _ in range(6): a @ a
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n

def host(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    a = torch.empty(16384, 16384, device="cuda", dtype=torch.bfloat16)
    for _ in range(12): a @ a  # ~100 ms of GPU work ahead
    t = time.perf_counter()
    for _ in range(n): fn()
    h = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize(); return h

res = {"gpu": torch.cuda.get_device_name()}
for S in (32768, 131072):
    q, k, v = qwen_inputs(S)
    scale = 128 ** -0.5
    for sink, window in ((8, 512), (128, 4096)):
        out, lse = a_shape_attention(q, k, v, sink=sink, window=window, impl="auto")
        o2, l2 = flash_attn_func(_bshd(q), _bshd(k), _bshd(v), softmax_scale=scale, causal=False, window_size=(window - 1, 0), return_lse=True)
        o2 = o2.transpose(1, 2)
        fns = {
            "ours-auto": lambda: a_shape_attention(q, k, v, sink=sink, window=window, impl="auto"),
            "fa4-window": lambda: flash_attn_func(_bshd(q), _bshd(k), _bshd(v), softmax_scale=scale, causal=False, window_size=(window - 1, 0), return_lse=True),
            "sink-merge": lambda: _launch_sink_merge_fwd(o2, l2, q, k, v, sink=sink, window=window, row_lo=window, row_hi=S, scale=scale),
            "minference": minference_streaming_call(q, k, v, sink=sink, window=window),
        }
        for name, fn in fns.items():
            with torch.no_grad():
                r = {"synced_ms": synced(fn), "b2b_gpu_ms": b2b(fn), "host_ms": host(fn)}
            res[f"{S // 1024}K ({sink},{window}) {name}"] = r
            print(f"{S // 1024}K ({sink},{window}) {name:12s} " + "  ".join(f"{a} {b:.3f}" for a, b in r.items()), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "ashape_host.json"), "w"), indent=1)
