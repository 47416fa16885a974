"""The small torch.compile workload of docs/inductor-cpu.md#the-workload, on CPU: two transformer
blocks (d=256, 4 heads, causal SDPA, 4*d GELU MLP), then LayerNorm -> 512 -> ReLU -> 10, input
(8, 64, 256) float32, inference mode. Prints one line `RESULT {json}`: the first compiled call's
time, torch's cache counters, and whether the compiled output equals eager."""
import json
import time

import torch
from torch import nn
from torch._dynamo.utils import counters


class Block(nn.Module):
    def __init__(self, d=256, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def main():
    torch.manual_seed(0)
    model = nn.Sequential(
        Block(), Block(), nn.LayerNorm(256), nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)
    ).eval()
    x = torch.randn(8, 64, 256)
    compiled = torch.compile(model)
    with torch.no_grad():
        eager = model(x)
        start = time.perf_counter()
        out = compiled(x)
        first_call_s = time.perf_counter() - start
    diff = (out - eager).abs().max().item()
    print(
        "RESULT "
        + json.dumps(
            {
                "first_call_s": round(first_call_s, 3),
                "max_abs_diff": diff,
                "equal_to_eager": bool(torch.allclose(out, eager, atol=1e-4, rtol=1e-4)),
                "threads": torch.get_num_threads(),
                "inductor": dict(counters["inductor"]),
                "aot_autograd": dict(counters["aot_autograd"]),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
