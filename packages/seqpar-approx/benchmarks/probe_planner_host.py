"""Host time of one MMInference host plan on the GPU: cProfile, op counts by line, syncs."""
import sys, collections, traceback, os, time, cProfile, pstats, io, warnings
import torch
from torch.utils._python_dispatch import TorchDispatchMode
sys.path.insert(0, "packages/seqpar-approx/benchmarks")
from spava_sparse import head_mix, token_layout
from seqpar_approx import MMInferenceHost
from sparse_patterns import MMInferencePlanner

n, H, HKV, D = 262144, 28, 4, 128
dev = torch.device("cuda")
lay = token_layout(n, 128, tokens_per_frame=256, device=dev)
heads = head_mix(H, tokens_per_frame=256, smoke=False)
pl = MMInferencePlanner(block=128)
host = MMInferenceHost(heads, token_layout=lay, block=128, planner=pl)
S, start = 65536, 4096 + 65536
q = torch.randn(1, H, S, D, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, HKV, S, D, device=dev, dtype=torch.bfloat16)
scale = D ** -0.5
fn = lambda: host.plan(q, k, start=start, scale=scale, exact_vertical_lists=False)
for _ in range(3): fn()
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10): fn()
torch.cuda.synchronize()
print(f"plan wall {(time.perf_counter() - t) / 10 * 1e3:.2f} ms")
# host time with the GPU idle before: queue a long kernel first, then time the host part only
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable(); fn(); torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40); print(s.getvalue()[:9000])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats("sparse_|seqpar", 50); print(s.getvalue()[:9000])

class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__(); self.c = collections.Counter(); self.n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        where = "?"
        for fr in reversed(traceback.extract_stack()):
            if "/src/" in fr.filename and "python_dispatch" not in fr.filename:
                where = fr.filename.split("/src/")[-1] + ":" + str(fr.lineno); break
        self.c[where] += 1
        return func(*args, **(kwargs or {}))
m = Count()
with m:
    fn()
print("total aten ops", m.n)
for w, c in m.c.most_common(60):
    print(f"{c:5d} {w}")
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    fn(); torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode(0)
print("syncs", len(w))
