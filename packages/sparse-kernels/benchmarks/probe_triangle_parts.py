"""Triangle at 32K/128K: ours-auto vs flex-fa4 synced; parts (FA4 window, sink merge, last rows);
cProfile of our host path."""
import time, json, os, cProfile, pstats, io
import torch
from sparse_kernels import triangle_attention, a_shape_attention
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.fa4.engine import _bshd
from sparse_kernels.triangle.sink_merge_triton import _launch_sink_merge_fwd
from sparse_kernels.triangle.triton import _launch_triangle_fwd
from flash_attn.cute import flash_attn_func
import importlib.util, sys
sys.path.insert(0, "packages/sparse-kernels/benchmarks")

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
    a = torch.empty(16384, 16384, device="cuda", dtype=torch.bfloat16)
    for _ in range(6): a @ a
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n

def host(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    a = torch.empty(16384, 16384, device="cuda", dtype=torch.bfloat16)
    for _ in range(12): a @ a
    t = time.perf_counter()
    for _ in range(n): fn()
    h = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize(); return h

from torch.nn.attention.flex_attention import flex_attention, create_block_mask
flex = torch.compile(flex_attention, dynamic=False)
res = {"gpu": torch.cuda.get_device_name()}
torch.set_grad_enabled(False)
for S in (131072,):
    q, k, v = qwen_inputs(S)
    scale = 128 ** -0.5
    for sink, window, last in ((8, 512, 128), (128, 4096, 128)):
        def mm(b, h, i, j, sink=sink, window=window, last=last, S=S):
            return (j <= i) & ((j < sink) | (i - j < window) | (i >= S - last))
        bm = create_block_mask(mm, None, None, S, S, device="cuda", _compile=True)
        o2, l2 = flash_attn_func(_bshd(q), _bshd(k), _bshd(v), softmax_scale=scale, causal=False, window_size=(window - 1, 0), return_lse=True)
        o2 = o2.transpose(1, 2)
        fns = {
            "ours-auto": lambda: triangle_attention(q, k, v, sink=sink, window=window, last=last, impl="auto"),
            "flex-fa4": lambda: flex(q, k, v, block_mask=bm, scale=scale, enable_gqa=True, kernel_options={"BACKEND": "FLASH"}),
            "fa4-window": lambda: flash_attn_func(_bshd(q), _bshd(k), _bshd(v), softmax_scale=scale, causal=False, window_size=(window - 1, 0), return_lse=True),
            "sink-merge": lambda: _launch_sink_merge_fwd(o2, l2, q, k, v, sink=sink, window=window, row_lo=window, row_hi=S - last, scale=scale),
            "last-rows": lambda: _launch_triangle_fwd(q[:, :, S - last:], k, v, sink=sink, window=window, last=last, scale=scale),
        }
        for name, fn in fns.items():
            try:
                r = {"synced_ms": synced(fn), "b2b_gpu_ms": b2b(fn), "host_ms": host(fn)}
            except Exception as e:
                r = {"error": repr(e)[:300]}
            res[f"{S // 1024}K ({sink},{window},{last}) {name}"] = r
            print(f"{S // 1024}K ({sink},{window},{last}) {name:12s} " + "  ".join(f"{a} {b:.3f}" if isinstance(b, float) else f"{a} {b}" for a, b in r.items()), flush=True)
# host profile of our A-shape path
q, k, v = qwen_inputs(32768)
fn = lambda: a_shape_attention(q, k, v, sink=8, window=512, impl="auto")
for _ in range(5): fn()
torch.cuda.synchronize()
a = torch.empty(16384, 16384, device="cuda", dtype=torch.bfloat16)
for _ in range(40): a @ a
pr = cProfile.Profile(); pr.enable()
for _ in range(100): fn()
pr.disable(); torch.cuda.synchronize()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45); print(s.getvalue())
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(45); print(s.getvalue())
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "tri_parts.json"), "w"), indent=1)
