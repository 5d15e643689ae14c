"""Golden fixture for the Llama-3 model: a tiny model in plain PyTorch (float64), its inputs,
logits, loss, every gradient, and the losses of 10 AdamW steps, written to
tests/fixtures/llama3_golden.safetensors. The C++ parity test loads the same weights by name
and must match. Semantics follow Hugging Face's Llama (rotate-half RoPE with Llama 3.1 frequency
scaling, GQA, SwiGLU, RMSNorm) and TorchTitan's parameter names.

    reference/.venv/bin/python reference/llama3.py
"""
import json
import math
import pathlib

import torch
from safetensors.torch import save_file

ARGS = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96, multiple_of=32, norm_eps=1e-5,
            rope_theta=500000.0, max_seq_len=64, rope_llama3_scaling=True)
BATCH, SEQ = 2, 16
ADAMW = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_norm=1.0, steps=10)


def ffn_hidden(a):
    h = 2 * (4 * a["dim"]) // 3
    return a["multiple_of"] * ((h + a["multiple_of"] - 1) // a["multiple_of"])


def inv_freq(a):
    hd = a["dim"] // a["n_heads"]
    f = 1.0 / (a["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if not a["rope_llama3_scaling"]:
        return f
    factor, low, high, old = 8.0, 1.0, 4.0, 8192.0
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in f.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(freq)
        elif wavelen > low_wavelen:
            out.append(freq / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(out, dtype=torch.float64)


def rope(x, pos, freqs):  # x [B, S, H, Dh], rotate-half pairing
    ang = pos[:, :, None].double() * freqs[None, None, :]  # [B, S, Dh/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, :, None, :]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def forward(p, tokens, a):
    b, s = tokens.shape
    h_, kv, hd = a["n_heads"], a["n_kv_heads"], a["dim"] // a["n_heads"]
    pos = torch.arange(s)[None, :].expand(b, s)
    freqs = inv_freq(a)
    x = p["tok_embeddings.weight"][tokens]
    mask = torch.full((s, s), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(a["n_layers"]):
        pre = f"layers.{l}."
        hn = rmsnorm(x, p[pre + "attention_norm.weight"], a["norm_eps"])
        q = (hn @ p[pre + "attention.wq.weight"].T).view(b, s, h_, hd)
        k = (hn @ p[pre + "attention.wk.weight"].T).view(b, s, kv, hd)
        v = (hn @ p[pre + "attention.wv.weight"].T).view(b, s, kv, hd)
        q, k = rope(q, pos, freqs), rope(k, pos, freqs)
        rep = h_ // kv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(hd) + mask
        o = torch.einsum("bhst,bthd->bshd", scores.softmax(-1), v).reshape(b, s, h_ * hd)
        x = x + o @ p[pre + "attention.wo.weight"].T
        hn = rmsnorm(x, p[pre + "ffn_norm.weight"], a["norm_eps"])
        g = hn @ p[pre + "feed_forward.w1.weight"].T
        u = hn @ p[pre + "feed_forward.w3.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ p[pre + "feed_forward.w2.weight"].T
    x = rmsnorm(x, p["norm.weight"], a["norm_eps"])
    return (x @ p["output.weight"].T).reshape(b * s, -1)


def init_params(a, gen):
    d, hd, f, v = a["dim"], a["dim"] // a["n_heads"], ffn_hidden(a), a["vocab_size"]
    shapes = {"tok_embeddings.weight": (v, d), "norm.weight": (d,), "output.weight": (v, d)}
    for l in range(a["n_layers"]):
        pre = f"layers.{l}."
        shapes.update({pre + "attention.wq.weight": (a["n_heads"] * hd, d), pre + "attention.wk.weight": (a["n_kv_heads"] * hd, d),
                       pre + "attention.wv.weight": (a["n_kv_heads"] * hd, d), pre + "attention.wo.weight": (d, a["n_heads"] * hd),
                       pre + "feed_forward.w1.weight": (f, d), pre + "feed_forward.w2.weight": (d, f),
                       pre + "feed_forward.w3.weight": (f, d), pre + "attention_norm.weight": (d,), pre + "ffn_norm.weight": (d,)})
    p = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):  # not all ones, so the norms' weights are really tested
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            t = 0.08 * torch.randn(shape, generator=gen, dtype=torch.float64)
        p[name] = t.requires_grad_()
    return p


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    gen = torch.Generator().manual_seed(1234)
    a = ARGS
    p = init_params(a, gen)
    data = torch.randint(0, a["vocab_size"], (BATCH, SEQ + 1), generator=gen)
    tokens, targets = data[:, :-1], data[:, 1:].reshape(-1).clone()
    targets[3] = -100  # an ignored position
    out = {f"param.{k}": v.detach().float().contiguous() for k, v in p.items()}
    logits = forward(p, tokens, a)
    loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
    loss.backward()
    out.update({f"grad.{k}": v.grad.float().contiguous() for k, v in p.items()})
    out["tokens"] = tokens.to(torch.int32).contiguous()
    out["targets"] = targets.to(torch.int32).contiguous()
    out["logits"] = logits.detach().float().contiguous()
    out["loss"] = loss.detach().float().reshape(1)
    # 10 AdamW steps on the same batch, with global-norm clipping; no decay for norm weights.
    for t in p.values():
        t.grad = None
    decay = [t for k, t in p.items() if not k.endswith("norm.weight")]
    no_decay = [t for k, t in p.items() if k.endswith("norm.weight")]
    o = ADAMW
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    losses = []
    for _ in range(o["steps"]):
        opt.zero_grad()
        l = torch.nn.functional.cross_entropy(forward(p, tokens, a), targets, ignore_index=-100)
        l.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), o["max_norm"])
        opt.step()
        losses.append(l.item())
    out["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    meta = {"args": json.dumps(a), "batch": str(BATCH), "seq": str(SEQ), "adamw": json.dumps(o),
            "generator": "reference/llama3.py"}
    path = root / "tests/fixtures/llama3_golden.safetensors"
    save_file(out, str(path), metadata=meta)
    print(f"wrote {path} ({path.stat().st_size} bytes); loss {loss.item():.6f}; adamw losses {losses}")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
