"""Where the Triton rotary kernel and the eager form differ (GPU check): per case, the count of
differing elements and the largest difference in units of the output dtype's last place."""

import torch
from sparse_kernels.fused import rotary, rotary_reference

for D in (64, 80, 128):
    for dtype in (torch.float16, torch.bfloat16):
        g = torch.Generator(device="cuda").manual_seed(D)
        q = torch.randn(1, 70, 7, D, device="cuda", generator=g).to(dtype).transpose(1, 2)
        k = torch.randn(1, 70, 1, D, device="cuda", generator=g).to(dtype).transpose(1, 2)
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda") / D))
        ang = torch.arange(70, device="cuda")[:, None] * inv[None]
        emb = torch.cat((ang, ang), -1)[None]
        c, s = emb.cos().to(dtype), emb.sin().to(dtype)
        got, ref = rotary(q, k, c, s)[0], rotary_reference(q, k, c, s)[0]
        diff = got.float() != ref.float()
        ulp = ((got.float() - ref.float()).abs() / ref.float().abs().clamp_min(1e-30)).max()
        eps = torch.finfo(dtype).eps
        print(
            f"D={D} {dtype}: {int(diff.sum())}/{diff.numel()} differ, max rel {float(ulp):.2e}"
            f" ({float(ulp) / eps:.2f} eps), strides {got.stride()} vs {ref.stride()}"
        )
        if diff.any():
            i = diff.nonzero()[0].tolist()
            print("  first", i, float(got[tuple(i)]), float(ref[tuple(i)]))
