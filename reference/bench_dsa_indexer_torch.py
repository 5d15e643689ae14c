"""PyTorch side of bench/bench_dsa_indexer: the lightning indexer ops written naturally in eager
PyTorch (einsum scores, ReLU, weighted head sum, causal mask, topk; KL loss + autograd backward),
timed best-of-reps, printing one JSON line {"seconds": ...}. Called by the C++ benchmark when
reference/.venv exists. As in the C++ kernels, the dense loss recomputes its target (the head mean
of the main attention's probabilities) while the sparse loss takes it per selected slot (target
[S, K], from the sparse attention's forward; built here in setup, outside the timing). Queries run in chunks of --chunk rows so the [chunk, HI, Skv] score
tensors fit in memory (a full [S, HI, S] tensor is 4 GiB at HI = 64, S = 4096).

    reference/.venv/bin/python reference/bench_dsa_indexer_torch.py --op topk --seq 4096 \
        --hi 4 --di 64 --topk 256 --heads 16 --hk 1 --dim 576 --dtype float32
"""
import argparse
import json
import time

import torch


def index_scores(q, k, w):
    # q [S, HI, DI], k [Skv, DI], w [S, HI] -> I [S, Skv]
    return (torch.relu(torch.einsum("shd,kd->shk", q, k)) * w.unsqueeze(-1)).sum(1)


def causal_mask(t0, rows, skv, s):
    t = torch.arange(t0, t0 + rows).unsqueeze(1) + (skv - s)
    return torch.arange(skv).unsqueeze(0) <= t  # [rows, Skv]


def topk(q, k, w, K, chunk):
    s, skv = q.shape[0], k.shape[0]
    out = []
    for t0 in range(0, s, chunk):
        rows = min(chunk, s - t0)
        scores = index_scores(q[t0:t0 + rows], k, w[t0:t0 + rows]).float()
        scores = scores.masked_fill(~causal_mask(t0, rows, skv, s), float("-inf"))
        vals, idx = scores.topk(min(K, skv), dim=-1)
        idx = idx.masked_fill(vals == float("-inf"), -1)
        out.append(idx.sort(dim=-1).values)  # ascending, as the C++ kernel (padding sorts first here)
    return torch.cat(out)


def kl_loss(q, k, w, mq, mk, mlse, scale, idx, target, chunk):
    """Sum of KL(p || softmax(I)) over rows; backward per chunk (gradients accumulate). Dense
    stage (idx None): p recomputed from mq, mk, mlse. Sparse: p = target scattered to its keys."""
    s, skv = q.shape[0], k.shape[0]
    total = 0.0
    for t0 in range(0, s, chunk):
        rows = min(chunk, s - t0)
        mask = causal_mask(t0, rows, skv, s)
        if idx is None:
            p = dense_target(mq, mk, mlse, scale, t0, rows, mask)
        else:
            i = idx[t0:t0 + rows].long()
            slot = torch.where(i < 0, skv, i)
            sel = torch.zeros(rows, skv + 1, dtype=torch.bool).scatter_(1, slot, True)
            mask = mask & sel[:, :skv]
            p = torch.zeros(rows, skv + 1).scatter_add_(1, slot, target[t0:t0 + rows])[:, :skv]
        scores = index_scores(q[t0:t0 + rows], k, w[t0:t0 + rows]).float().masked_fill(~mask, float("-inf"))
        log_q = torch.log_softmax(scores, dim=-1)
        loss = torch.where(p > 0, p * (torch.log(p) - log_q), torch.zeros_like(p)).sum()
        loss.backward()
        total += loss.item()
    return total


@torch.no_grad()
def dense_target(mq, mk, mlse, scale, t0, rows, mask):
    """Head mean of the main attention's probabilities for query rows [t0, t0 + rows): [rows, Skv]."""
    heads, hk = mq.shape[1], mk.shape[1]
    mkh = mk.repeat_interleave(heads // hk, dim=1)  # [Skv, H, D]
    logits = scale * torch.einsum("thd,shd->hts", mq[t0:t0 + rows].float(), mkh.float())
    return torch.exp(logits - mlse[t0:t0 + rows].t().unsqueeze(-1)).masked_fill(~mask, 0).mean(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", choices=["topk", "sparse_loss", "dense_loss"], required=True)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--hi", type=int, default=4)
    ap.add_argument("--di", type=int, default=64)
    ap.add_argument("--topk", type=int, default=256)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--hk", type=int, default=1)
    ap.add_argument("--dim", type=int, default=576)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=512)
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    s = a.seq
    q = (torch.rand(s, a.hi, a.di, generator=g) * 2 - 1).to(dt)
    k = (torch.rand(s, a.di, generator=g) * 2 - 1).to(dt)
    w = torch.rand(s, a.hi, generator=g) * 2 - 1
    if a.op == "topk":
        run = lambda: topk(q, k, w, a.topk, a.chunk)  # noqa: E731
    else:
        mq = (torch.rand(s, a.heads, a.dim, generator=g) * 2 - 1).to(dt)
        mk = (torch.rand(s, a.hk, a.dim, generator=g) * 2 - 1).to(dt)
        scale = a.dim ** -0.5
        idx = topk(q, k, w, a.topk, a.chunk) if a.op == "sparse_loss" else None
        # The main attention's lse over each row's valid set, so the target rows sum to 1.
        mlse = torch.empty(s, a.heads)
        with torch.no_grad():
            mkh = mk.repeat_interleave(a.heads // a.hk, dim=1).float()
            for t0 in range(0, s, a.chunk):
                rows = min(a.chunk, s - t0)
                mask = causal_mask(t0, rows, s, s)
                if idx is not None:
                    sel = torch.zeros(rows, s + 1, dtype=torch.bool)
                    i = idx[t0:t0 + rows].long()
                    sel.scatter_(1, torch.where(i < 0, s, i), True)
                    mask = mask & sel[:, :s]
                logits = scale * torch.einsum("thd,shd->hts", mq[t0:t0 + rows].float(), mkh)
                mlse[t0:t0 + rows] = torch.logsumexp(logits.masked_fill(~mask, float("-inf")), -1).t()
        target = None
        if idx is not None:  # the sparse attention's head mean per selected slot (0 for -1 slots)
            target = torch.empty(s, idx.shape[1])
            for t0 in range(0, s, a.chunk):
                rows = min(a.chunk, s - t0)
                i = idx[t0:t0 + rows].long()
                p = dense_target(mq, mk, mlse, scale, t0, rows, causal_mask(t0, rows, s, s))
                target[t0:t0 + rows] = p.gather(1, i.clamp(min=0)).masked_fill(i < 0, 0)
        qg, kg, wg = q.clone().requires_grad_(), k.clone().requires_grad_(), w.clone().requires_grad_()

        def run():
            qg.grad = kg.grad = wg.grad = None
            kl_loss(qg, kg, wg, mq, mk, mlse, scale, idx, target, a.chunk)

    run()  # warm-up
    best = float("inf")
    for _ in range(a.reps):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"seconds": best, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
