"""PyTorch side of bench/bench_sparse_mla: sparse MLA attention (absorbed MQA form) written the
natural way in eager PyTorch -- gather the selected latent rows, einsum for the scores, masked
softmax, einsum for the output -- with autograd for the backward. Prints one JSON line with the
best forward and forward+backward wall times. Called by the C++ benchmark when reference/.venv
exists.

    reference/.venv/bin/python reference/bench_sparse_mla_torch.py --seq 4096 --heads 16 \
        --dqk 576 --dv 512 --topk 256 --dtype float32 --reps 3

Queries are processed in chunks of --chunk rows (default: all at once) only so that the gathered
[chunk, K, Dqk] rows fit in memory at large K; each chunk is the same natural formulation.
"""
import argparse
import json
import time

import torch


def sparse_mla(q, kv, idx, dv, scale):
    """q [S, H, Dqk], kv [Skv, Dqk], idx [S, K] (int) -> o [S, H, dv]. Query t sits at key
    position t + Skv - S; slots outside [0, that position] are ignored."""
    s, skv = q.shape[0], kv.shape[0]
    pos = torch.arange(s, device=q.device) + (skv - s)
    valid = (idx >= 0) & (idx <= pos[:, None])  # [S, K]
    rows = kv[idx.clamp(min=0)]  # [S, K, Dqk]
    scores = torch.einsum("shd,skd->shk", q, rows).float() * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0).to(q.dtype)  # empty rows: o = 0
    return torch.einsum("shk,skd->shd", p, rows[..., :dv])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dqk", type=int, default=576)
    ap.add_argument("--dv", type=int, default=512)
    ap.add_argument("--topk", type=int, default=256)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=0)
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    torch.manual_seed(0)
    s, k = a.seq, a.topk
    q = (torch.rand(s, a.heads, a.dqk) * 2 - 1).to(dt).requires_grad_()
    kv = (torch.rand(s, a.dqk) * 2 - 1).to(dt).requires_grad_()
    # Causal top-k style rows: query t selects min(k, t + 1) distinct keys in [0, t], -1 after.
    scores = torch.rand(s, s).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -1.0)
    top = torch.topk(scores, min(k, s), dim=-1)
    idx = top.indices.masked_fill(top.values < 0, -1)
    dout = (torch.rand(s, a.heads, a.dv) * 2 - 1).to(dt)
    scale = a.dqk ** -0.5
    chunk = a.chunk or s

    def forward():
        return [sparse_mla(q[i:i + chunk], kv[: i + chunk], idx[i:i + chunk], a.dv, scale) for i in range(0, s, chunk)]

    def both():
        outs = forward()
        for i, o in zip(range(0, s, chunk), outs):
            o.backward(dout[i:i + chunk])
        q.grad = kv.grad = None

    def best(f):
        t = float("inf")
        for _ in range(a.reps):
            t0 = time.perf_counter()
            f()
            t = min(t, time.perf_counter() - t0)
        return t

    with torch.no_grad():
        forward()  # warm-up
        t_fwd = best(forward)
    both()
    t_both = best(both)
    print(json.dumps({"fwd_s": t_fwd, "fwd_bwd_s": t_both, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
