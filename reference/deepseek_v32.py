"""Golden fixture for DeepSeek-V3.2 TRAINING (DeepSeek Sparse Attention): a tiny model, written in
float64 from the math of docs/dsa.md, with weights and checkpoint layout from
Hugging Face transformers' DeepseekV32ForCausalLM. Writes tests/fixtures/deepseek_v32_tiny/:
config.json and model.safetensors as transformers' save_pretrained writes them (f32 weights, hub
layout: one tensor per expert), and golden.safetensors (below).

Why not just HF's model: its indexer runs under no_grad (inference only: no indexer loss, no
indexer gradients) and it evaluates RMSNorm, RoPE tables, the router and the index scores in f32.
So the forward and the training objective are written here in float64; HF's model is then used
as a check (asserted below): with index_topk >= S its logits equal our dense stage's, with the
fixture's index_topk its logits equal our sparse stage's, and its LM-loss gradients equal ours for
every non-indexer weight (all within HF's f32 roundings); its top-k sets equal ours.

transformers 5.24's deepseek_v32 against docs/dsa.md: the indexer matches (q from qr = q_a_layernorm(
q_a_proj x), k = LayerNorm(wk x) with bias and eps 1e-6, rotate-half RoPE on the FIRST
qk_rope_head_dim dims, weights scaled by index_n_heads^-0.5 and the scores by index_head_dim^-0.5
before the ReLU, one positive product as docs/dsa.md's), MLA and the router too. Differences, none of
which changes this fixture: the indexer has no gradient (@torch.no_grad) and no loss; it skips the
Hadamard rotation (score-preserving) and FP8; it scores in f32 and keeps weights_proj in f32;
RMSNorm, the RoPE tables and the router run in f32 even in a float64 model; the RoPE tables (the
indexer's included) carry YaRN's mscale / mscale_all_dim ratio, 1 in DeepSeek's configs (docs/dsa.md:
the indexer has no mscale); unselected keys get finfo.min rather than -inf; the router is always
sigmoid (there is no scoring_func key); rows with t + 1 < index_topk select future keys too,
which the causal mask then drops (our -1 padding).

Conventions (the C++ parity test relies on each):
* Architecture: embed -> 2 x (RMSNorm -> MLA -> residual, RMSNorm -> FFN -> residual) -> RMSNorm
  -> lm_head. Layer 0 dense SwiGLU, layer 1 MoE (4 routed experts, top-2, 1 shared; HF V3.2's
  router: sigmoid scores, + e_score_correction_bias for the choice only, top-k weights normalised
  (norm_topk_prob) then times routed_scaling_factor; one expert group). No YaRN (rope_type
  default), so the MLA softmax scale is (qk_nope + qk_rope)^-0.5. All norms eps 1e-6.
* MLA: qr = q_norm(wq_a x); q = wq_b qr per head [nope | rope]; kv = wkv_a x = [c | k_rope],
  c = kv_norm(c); interleaved RoPE on q_rope and k_rope (pairs (2i, 2i+1)); keys/values per
  head from wkv_b c.
* Indexer (every layer): inputs x (the block's normed input) and qr, both DETACHED.
  qI = wq_b qr -> [HI, DI]; kI = LayerNorm(wk x) (weight and bias); RoPE on the FIRST qk_rope dims
  of qI and kI, non-interleaved (rotate-half: pair (i, i + qk_rope/2)); Hadamard (Sylvester,
  / sqrt(DI)) on both; w = weights_proj(x) * HI^-0.5 * DI^-0.5;
  I(t, s) = sum_j w[t, j] * ReLU(qI[t, j] . kI[s]) for s <= t.
* Dense warm-up stage ("dense."): dense causal MLA. Target p[t] = mean over heads of the main
  attention's causal probabilities (detached). Per-layer indexer loss = mean over all B*S rows of
  KL(p[t] || softmax_{s<=t} I[t]) (0 log 0 = 0). Stored gradients: only the indexer weights,
  of coeff * sum over layers of the per-layer loss (the warm-up freezes every other weight; the
  LM loss does not reach the indexer because its inputs are detached).
* Sparse stage ("sparse."): idx[t] = the top-k (k = index_topk) keys of I[t] among s <= t (all of
  them, -1 padded, when t + 1 <= k). Attention per head is the causal softmax restricted to idx.
  Target p[t] = head-mean of those restricted per-head probabilities (detached); KL over idx[t];
  same per-layer mean. Gradients of LM loss + coeff * sum of the per-layer losses, for every
  weight: the main weights get only the LM part, the indexer weights only the indexer part.
* LM loss: mean cross-entropy over targets != -100 (one target is -100).
* The seed is chosen (deterministically, first that passes) so that every top-k boundary and every
  MoE routing choice has a margin >= 1e-3 relative to the row's score scale: f32 C++ kernels
  select the same sets.

golden.safetensors (f32 unless said): tokens [B, S] i32, targets [B*S] i32, indexer_loss_coeff [1];
per stage P in {dense, sparse}: P.logits [B*S, V], P.loss [1] (LM), P.indexer_loss [L] (unweighted
per-layer mean KL), P.grad.<HF name> (dense: indexer weights only; sparse: every weight);
sparse.topk_indices [L, B, S, K] i32, each row ascending with -1 padding (the kernels' order; the
set is what matters).

    reference/.venv/bin/python reference/deepseek_v32.py   (transformers >= 5.24; see requirements.txt)
"""
import json
import math
import pathlib
import tempfile

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

BATCH, SEQ = 2, 24
INDEXER_LOSS_COEFF = 0.01
CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
    n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
    routed_scaling_factor=1.5, norm_topk_prob=True,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    index_n_heads=8, index_head_dim=16, index_topk=8,
    max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0),
)
MARGIN = 1e-3
EPS = 1e-6
HF_TOL = 2e-5  # HF's f32 RMSNorm / RoPE tables / router against our float64


def rms_norm(x, w):
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def rope_angles(seq, dim, theta):
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [S, dim/2]
    return ang.cos(), ang.sin()


def rope_interleaved(x, cos, sin):  # x [B, S, ..., d]; pairs (2i, 2i+1)
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 3) + (cos.shape[-1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)


def rope_rotate_half(x, cos, sin):  # pairs (i, i + d/2)
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 3) + (cos.shape[-1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1)


def hadamard(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / math.sqrt(n)


def kl_rows(p, logits, valid):
    """KL(p || softmax(logits)) per row over the valid set; p is zero outside it."""
    logq = torch.log_softmax(logits.masked_fill(~valid, float("-inf")), dim=-1)
    logq = logq.masked_fill(~valid, 0.0)
    plogp = torch.where(p > 0, p * torch.log(torch.where(p > 0, p, torch.ones_like(p))), torch.zeros_like(p))
    return (plogp - p * logq).sum(-1)


class Reference:
    def __init__(self, cfg, params):
        self.c = cfg
        self.p = params  # HF hub name -> float64 leaf tensor

    def w(self, name):
        return self.p[name]

    def attention(self, layer, x, stage, cos, sin, margins):
        c, pre = self.c, f"model.layers.{layer}.self_attn."
        b, s, _ = x.shape
        h, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        hi, di, k_top = c["index_n_heads"], c["index_head_dim"], c["index_topk"]
        qr = rms_norm(x @ self.w(pre + "q_a_proj.weight").T, self.w(pre + "q_a_layernorm.weight"))
        q = (qr @ self.w(pre + "q_b_proj.weight").T).view(b, s, h, dn + dr)
        q_nope, q_rope = q[..., :dn], rope_interleaved(q[..., dn:], cos, sin)
        kv = x @ self.w(pre + "kv_a_proj_with_mqa.weight").T
        latent = rms_norm(kv[..., :c["kv_lora_rank"]], self.w(pre + "kv_a_layernorm.weight"))
        k_rope = rope_interleaved(kv[..., c["kv_lora_rank"]:], cos, sin)  # [B, S, dr], shared by heads
        kvb = (latent @ self.w(pre + "kv_b_proj.weight").T).view(b, s, h, dn + dv)
        k_nope, v = kvb[..., :dn], kvb[..., dn:]
        tau = (dn + dr) ** -0.5
        scores = tau * (torch.einsum("bthd,bshd->bhts", q_nope, k_nope) + torch.einsum("bthd,bsd->bhts", q_rope, k_rope))
        causal = torch.ones(s, s, dtype=torch.bool).tril()  # [t, s]

        # Lightning indexer on detached inputs.
        xi, qri = x.detach(), qr.detach()
        ip = pre + "indexer."
        qi = (qri @ self.w(ip + "wq_b.weight").T).view(b, s, hi, di)
        ki = F.layer_norm(xi @ self.w(ip + "wk.weight").T, (di,), self.w(ip + "k_norm.weight"),
                          self.w(ip + "k_norm.bias"), eps=EPS)
        qi = torch.cat((rope_rotate_half(qi[..., :dr], cos, sin), qi[..., dr:]), -1)
        ki = torch.cat((rope_rotate_half(ki[..., :dr], cos, sin), ki[..., dr:]), -1)
        hd = hadamard(di)
        qi, ki = qi @ hd, ki @ hd
        wts = (xi @ self.w(ip + "weights_proj.weight").T) * hi ** -0.5 * di ** -0.5  # [B, S, HI]
        index = torch.einsum("btj,btjs->bts", wts, torch.relu(torch.einsum("btjd,bsd->btjs", qi, ki)))  # [B, t, s]

        topk = None
        if stage == "dense":
            valid = causal.expand(b, s, s)
        else:
            masked = index.detach().masked_fill(~causal, float("-inf"))
            order = masked.sort(dim=-1, descending=True)
            sel = torch.zeros(b, s, s, dtype=torch.bool)
            topk = torch.full((b, s, k_top), -1, dtype=torch.int32)
            for bi in range(b):
                for t in range(s):
                    n = min(k_top, t + 1)
                    chosen = order.indices[bi, t, :n]
                    sel[bi, t, chosen] = True
                    topk[bi, t, :n] = chosen.sort().values.to(torch.int32)
                    if t + 1 > k_top:  # the boundary must be clear for f32 kernels
                        vals = order.values[bi, t]
                        scale = vals[: t + 1].abs().max().item()
                        margins.append((vals[k_top - 1] - vals[k_top]).item() / scale if scale > 0 else 0.0)
            valid = sel & causal
        probs = torch.softmax(scores.masked_fill(~valid[:, None], float("-inf")), dim=-1)  # [B, H, t, s]
        out = torch.einsum("bhts,bshd->bthd", probs, v).reshape(b, s, h * dv)
        target = probs.detach().mean(1)  # [B, t, s]: the head-mean of the (restricted) probabilities
        index_loss = kl_rows(target, index, valid).mean()
        return out @ self.w(pre + "o_proj.weight").T, index_loss, topk

    def swiglu(self, x, gate, up, down):
        return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T

    def moe(self, layer, x, margins):
        c, pre = self.c, f"model.layers.{layer}.mlp."
        assert c["n_group"] == 1
        flat = x.reshape(-1, x.shape[-1])
        scores = torch.sigmoid(flat @ self.w(pre + "gate.weight").T)  # [T, E]
        choice = scores.detach() + self.w(pre + "gate.e_score_correction_bias")
        order = choice.sort(dim=-1, descending=True)
        kk = c["num_experts_per_tok"]
        margins.extend(((order.values[:, kk - 1] - order.values[:, kk]) / order.values[:, 0].abs()).tolist())
        chosen = order.indices[:, :kk]
        gates = scores.gather(1, chosen)
        if c["norm_topk_prob"]:
            gates = gates / gates.sum(-1, keepdim=True)
        gates = gates * c["routed_scaling_factor"]
        out = self.swiglu(flat, self.w(pre + "shared_experts.gate_proj.weight"), self.w(pre + "shared_experts.up_proj.weight"),
                          self.w(pre + "shared_experts.down_proj.weight"))
        for e in range(c["n_routed_experts"]):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            ep = f"{pre}experts.{e}."
            y = self.swiglu(flat[rows], self.w(ep + "gate_proj.weight"), self.w(ep + "up_proj.weight"),
                            self.w(ep + "down_proj.weight"))
            out = out.index_add(0, rows, y * gates[rows, slot][:, None])
        return out.view_as(x)

    def forward(self, tokens, targets, stage):
        c = self.c
        margins = []
        cos, sin = rope_angles(tokens.shape[1], c["qk_rope_head_dim"], c["rope_parameters"]["rope_theta"])
        hcur = self.w("model.embed_tokens.weight")[tokens]
        index_losses, topks = [], []
        for layer in range(c["num_hidden_layers"]):
            pre = f"model.layers.{layer}."
            a, il, tk = self.attention(layer, rms_norm(hcur, self.w(pre + "input_layernorm.weight")), stage, cos, sin, margins)
            hcur = hcur + a
            index_losses.append(il)
            topks.append(tk)
            xn = rms_norm(hcur, self.w(pre + "post_attention_layernorm.weight"))
            if layer < c["first_k_dense_replace"]:
                hcur = hcur + self.swiglu(xn, self.w(pre + "mlp.gate_proj.weight"), self.w(pre + "mlp.up_proj.weight"),
                                          self.w(pre + "mlp.down_proj.weight"))
            else:
                hcur = hcur + self.moe(layer, xn, margins)
        logits = (rms_norm(hcur, self.w("model.norm.weight")) @ self.w("lm_head.weight").T).reshape(-1, c["vocab_size"])
        loss = F.cross_entropy(logits, targets, ignore_index=-100)
        return logits, loss, index_losses, topks, min(margins)


def make_weights(cfg, seed, out_dir):
    """HF's model with deterministic random weights (rounded to f32), saved by save_pretrained."""
    gen = torch.Generator().manual_seed(seed)
    config = DeepseekV32Config(**cfg)
    model = DeepseekV32ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:  # not all ones: norms are really tested
                t = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            elif name.endswith("norm.bias"):
                t = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                t = 0.08 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(t.float())
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # steers the routing: a wrong mapping shows
                buf.copy_((0.05 * torch.randn(buf.shape, generator=gen, dtype=torch.float64)).float())
    model.save_pretrained(out_dir)
    (pathlib.Path(out_dir) / "generation_config.json").unlink(missing_ok=True)
    data = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ + 1), generator=gen)
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].reshape(-1).clone()
    targets[5] = -100  # an ignored position
    return tokens, targets


def check_against_hf(out_dir, cfg, tokens, targets, ref_logits, ref_grads, topk):
    """HF's own forward (and LM backward) must reproduce ours: logits of both stages, the main
    weights' sparse-stage gradients and the top-k sets."""
    for stage, k in (("dense", SEQ), ("sparse", cfg["index_topk"])):
        model, info = DeepseekV32ForCausalLM.from_pretrained(out_dir, index_topk=k, output_loading_info=True,
                                                             attn_implementation="eager", experts_implementation="eager")
        assert not any(info.values()), f"HF load of our folder: {info}"
        model = model.double().train()
        logits = model(input_ids=tokens).logits.reshape(BATCH * SEQ, -1)
        err = (logits - ref_logits[stage]).abs().max().item()
        assert err < HF_TOL, f"{stage}: HF logits differ from ours by {err}"
        if stage != "sparse":
            continue
        F.cross_entropy(logits, targets, ignore_index=-100).backward()
        hf = {}
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            if name.endswith("experts.gate_up_proj"):
                half = cfg["moe_intermediate_size"]
                for e in range(p.shape[0]):
                    hf[name.replace("gate_up_proj", f"{e}.gate_proj.weight")] = p.grad[e, :half]
                    hf[name.replace("gate_up_proj", f"{e}.up_proj.weight")] = p.grad[e, half:]
            elif name.endswith("experts.down_proj"):
                for e in range(p.shape[0]):
                    hf[name.replace("down_proj", f"{e}.down_proj.weight")] = p.grad[e]
            else:
                hf[name] = p.grad
        main = [n for n in ref_grads if ".indexer." not in n]
        assert sorted(main) == sorted(hf), "HF's trainable weights differ from ours"
        for n in main:
            g = ref_grads[n]
            err = ((hf[n] - g).abs().max() / g.abs().max().clamp_min(1e-12)).item()
            assert err < 1e-4, f"HF grad {n} differs (relative {err})"
        # The top-k sets of layer 0 (its input does not depend on the selection) from HF's indexer.
        from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hfm
        captured = []
        original = hfm.DeepseekV32Indexer.forward

        def spy(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            captured.append(out)
            return out

        hfm.DeepseekV32Indexer.forward = spy
        try:
            with torch.no_grad():
                model(input_ids=tokens)
        finally:
            hfm.DeepseekV32Indexer.forward = original
        for layer, got in enumerate(captured):
            for bi in range(BATCH):
                for t in range(SEQ):
                    want = set(topk[layer][bi, t][topk[layer][bi, t] >= 0].tolist())
                    assert set(got[bi, t].tolist()) >= want and len(want) == min(t + 1, k), (layer, bi, t)


def write_fixture(root, name, cfg):
    out_dir = root / "tests/fixtures" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    for seed in range(1000, 1100):  # the first seed whose selections all have a clear margin
        with tempfile.TemporaryDirectory() as tmp:
            tokens, targets = make_weights(cfg, seed, tmp)
            weights = load_file(str(pathlib.Path(tmp) / "model.safetensors"))
            params = {n: t.double().requires_grad_(True) for n, t in weights.items()}
            ref = Reference(cfg, params)
            results = {stage: ref.forward(tokens, targets, stage) for stage in ("dense", "sparse")}
            if min(r[4] for r in results.values()) >= MARGIN:
                break
    else:
        raise RuntimeError("no seed gave clear top-k margins")
    make_weights(cfg, seed, out_dir)  # the folder as transformers writes it
    print(f"seed {seed}: smallest relative selection margin {min(r[4] for r in results.values()):.2e}")

    golden = {"tokens": tokens.to(torch.int32), "targets": targets.to(torch.int32),
              "indexer_loss_coeff": torch.tensor([INDEXER_LOSS_COEFF], dtype=torch.float32)}
    indexer = sorted(n for n in params if ".indexer." in n)
    ref_logits, ref_grads = {}, {}
    for stage, (logits, loss, index_losses, topks, _) in results.items():
        index_total = INDEXER_LOSS_COEFF * torch.stack(index_losses).sum()
        if stage == "dense":  # the warm-up trains only the indexer
            names = indexer
            grads = torch.autograd.grad(index_total, [params[n] for n in names])
        else:
            names = sorted(n for n in params if not n.endswith("e_score_correction_bias"))  # a buffer
            main = [n for n in names if n not in indexer]
            # The split the detaches promise: the LM loss does not reach the indexer, nor its loss the rest.
            assert all(g is None for g in torch.autograd.grad(loss, [params[n] for n in indexer], allow_unused=True,
                                                              retain_graph=True))
            assert all(g is None for g in torch.autograd.grad(index_total, [params[n] for n in main], allow_unused=True,
                                                              retain_graph=True))
            grads = torch.autograd.grad(loss + index_total, [params[n] for n in names])
        for n, g in zip(names, grads):
            assert g is not None, f"{stage}: no gradient for {n}"
            golden[f"{stage}.grad.{n}"] = g.float()
        ref_logits[stage] = logits.detach()
        if stage == "sparse":
            ref_grads = {n: g for n, g in zip(names, grads)}
            golden["sparse.topk_indices"] = torch.stack(topks)
        golden[f"{stage}.logits"] = logits.detach().float()
        golden[f"{stage}.loss"] = loss.detach().float().reshape(1)
        golden[f"{stage}.indexer_loss"] = torch.stack(index_losses).detach().float()
        print(f"{stage}: LM loss {loss.item():.6f}, indexer losses {[round(x.item(), 6) for x in index_losses]}")
    check_against_hf(out_dir, cfg, tokens, targets, ref_logits, ref_grads, golden["sparse.topk_indices"])
    golden = {n: t.contiguous() for n, t in golden.items()}
    save_file(golden, str(out_dir / "golden.safetensors"), metadata={"generator": "reference/deepseek_v32.py"})
    size = sum(f.stat().st_size for f in out_dir.iterdir())
    print(f"wrote {out_dir} ({size} bytes)")


def main():
    torch.use_deterministic_algorithms(True)
    root = pathlib.Path(__file__).resolve().parent.parent
    write_fixture(root, "deepseek_v32_tiny", CONFIG)


if __name__ == "__main__":
    main()
