"""Syncs and host/GPU time of one Spava host's MMInference step (a 64K segment) on one GPU."""

import collections
import sys
import time
import warnings

import torch

sys.path.insert(0, "packages/seqpar-approx/benchmarks")
from seqpar_approx import MMInferenceHost, PrefixBlocks
from spava_sparse import head_mix, token_layout

n, H, HKV, D = 262144, 28, 4, 128
dev = torch.device("cuda")
lay = token_layout(n, 128, tokens_per_frame=256, device=dev)
heads = head_mix(H, tokens_per_frame=256, smoke=False)
host = MMInferenceHost(
    heads, token_layout=lay, block=128, prefix=PrefixBlocks(top_k=16), dense_rows=4096
)
S, P, start = 65536, 6144, 4096 + 65536
g = torch.Generator(device=dev).manual_seed(0)
mk = lambda h, L: torch.randn(1, h, L, D, device=dev, dtype=torch.bfloat16, generator=g)
q, k, v, kp, vp = mk(H, S), mk(HKV, S), mk(HKV, S), mk(HKV, P), mk(HKV, P)
step = lambda: host(q, k, v, kp, vp, start=start, scale=D**-0.5, impl="auto")
for _ in range(3):
    step()
torch.cuda.synchronize()
real = torch.cuda.Event.synchronize
waits = []
torch.cuda.Event.synchronize = lambda e: waits.append(1) or real(e)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
torch.cuda.Event.synchronize = real
syncs = [w for w in seen if "synchronizing CUDA operation" in str(w.message)]
print(f"syncs in one host step: {len(syncs)} (+ {len(waits)} event waits)")
for (f, l), c in collections.Counter(
    (w.filename.split("/src/")[-1], w.lineno) for w in syncs
).items():
    print(f"   {c} x {f}:{l}")
# host time per step (no sync inside the loop but the step's own), and GPU-queued time
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(10):
    step()
t_host = (time.perf_counter() - t0) / 10
torch.cuda.synchronize()
t_all = (time.perf_counter() - t0) / 10
# the same steps behind a long GPU kernel: how much host time a queued GPU hides
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(40):
    a @ a  # ~40 x 1.6 ms of GPU work queued ahead
for _ in range(10):
    step()
torch.cuda.synchronize()
t_busy = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(40):
    a @ a
torch.cuda.synchronize()
t_mm = time.perf_counter() - t0
print(
    f"per step: host {t_host * 1e3:.2f} ms, to the GPU's end {t_all * 1e3:.2f} ms; behind 40 GEMMs: {(t_busy - t_mm) / 10 * 1e3:.2f} ms per step"
)
# GPU kernel time per step (profiler), against the step's wall time when nothing else is queued
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
gpu_us = sum(e.self_device_time_total for e in prof.key_averages())
print(f"GPU kernel time per step: {gpu_us / 3 / 1e3:.2f} ms (wall per step {t_all * 1e3:.2f} ms)")
