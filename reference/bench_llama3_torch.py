"""PyTorch side of bench/bench_train_step: trains the same Llama-3 shape (plain PyTorch modules,
HF semantics) for a few steps on random tokens, eager or torch.compile, and prints one JSON line
with tokens/s and peak resident memory. Called by the C++ benchmark when reference/.venv exists.

    reference/.venv/bin/python reference/bench_llama3_torch.py --dim 768 --layers 12 --heads 12 \
        --vocab 2048 --batch 4 --seq 1024 --steps 3 --dtype float32 --mode eager
"""
import argparse
import math
import resource

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_torch_step import time_training


class Block(nn.Module):
    def __init__(self, d, h, kv, f):
        super().__init__()
        self.h, self.kv, self.hd = h, kv, d // h
        self.attention_norm = nn.RMSNorm(d, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(d, eps=1e-5)
        self.wq = nn.Linear(d, h * self.hd, bias=False)
        self.wk = nn.Linear(d, kv * self.hd, bias=False)
        self.wv = nn.Linear(d, kv * self.hd, bias=False)
        self.wo = nn.Linear(h * self.hd, d, bias=False)
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        hn = self.attention_norm(x)
        q = self.wq(hn).view(b, s, self.h, self.hd).transpose(1, 2)
        k = self.wk(hn).view(b, s, self.kv, self.hd).transpose(1, 2)
        v = self.wv(hn).view(b, s, self.kv, self.hd).transpose(1, 2)

        def rot(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

        q, k = rot(q), rot(k)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        hn = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(hn)) * self.w3(hn))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        f = 2 * (4 * a.dim) // 3
        f = 256 * ((f + 255) // 256)
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(Block(a.dim, a.heads, a.kv_heads or a.heads, f) for _ in range(a.layers))
        self.norm = nn.RMSNorm(a.dim, eps=1e-5)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)
        hd = a.dim // a.heads
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.arange(a.seq).float()[:, None] * inv[None, :]
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1), persistent=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(dim=768, layers=12, heads=12, kv_heads=0, vocab=2048, batch=4, seq=1024, steps=3).items():
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--mode", default="eager", choices=["eager", "compile"])
    a = p.parse_args()
    torch.manual_seed(0)
    model = Llama(a)
    step_model = torch.compile(model) if a.mode == "compile" else model
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    time_training(model, step_model, tokens, a.vocab, a.dtype, a.steps, rss0, mode=a.mode)


if __name__ == "__main__":
    main()
