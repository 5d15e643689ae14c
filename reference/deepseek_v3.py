"""Golden fixtures for the DeepSeek-V3 model: tiny DeepseekV3ForCausalLMs from Hugging Face
transformers with random weights, evaluated in float64. Writes tests/fixtures/deepseek_v3_tiny/ in Hugging Face's layout
(config.json + model.safetensors, f32 weights) plus golden.safetensors: tokens, targets, logits,
loss and the gradient of every weight under its Hugging Face name. The C++ parity test loads the
folder through the HF adapter and must match.

Two folders: deepseek_v3_tiny covers the low-rank query path (q_lora_rank > 0) and YaRN with
mscale == mscale_all_dim != 1 (the softmax-scale factor); deepseek_v3_tiny_plain_q covers the plain
q_proj (q_lora_rank = None) without rope scaling. Both use HF's interleaved RoPE (rope_interleave =
True, the layout of DeepSeek's checkpoints) and rms_norm_eps = 1e-6 (HF's q/kv latent norms always
use 1e-6). Both are all-dense (first_k_dense_replace = num_hidden_layers).

deepseek_v3_tiny_moe has a MoE layer after a dense one, routed the DeepSeek-V3 way: sigmoid scores,
a nonzero e_score_correction_bias (it steers the choice: checked below), group-limited routing
(n_group 4, topk_group 2), norm_topk_prob and routed_scaling_factor 2.5, plus a shared expert.
transformers holds the experts fused ("mlp.experts.gate_up_proj" [E, 2F, D], gate rows first;
"mlp.experts.down_proj" [E, D, F]); the folder and the gradients use the hub's per-expert names
("mlp.experts.E.gate_proj.weight"), as DeepSeek's checkpoints do. HF's router computes its logits
in float32 whatever the model dtype (ours does too), so that one product is f32-rounded here; the
script checks that every token's top-k and group choice has a margin far above that rounding, so
the selection is the same in any f32 implementation.

    reference/.venv/bin/python reference/deepseek_v3.py   (transformers 5.x; see requirements.txt)
"""
import json
import pathlib

import torch
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

BATCH, SEQ = 2, 12
CONFIG = dict(
    vocab_size=96, hidden_size=64, intermediate_size=80, moe_intermediate_size=32,
    num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=4, num_key_value_heads=4,
    n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
    routed_scaling_factor=1.0, norm_topk_prob=False,
    q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
    max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_interleave=True,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                         beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707),
)


PLAIN_Q_CONFIG = dict(CONFIG, hidden_size=32, intermediate_size=48, num_hidden_layers=1, first_k_dense_replace=1,
                      num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=16,
                      max_position_embeddings=64, rope_parameters=dict(rope_type="default", rope_theta=10000.0))


MOE_CONFIG = dict(CONFIG, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
                  first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16,
                  kv_lora_rank=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, n_group=4,
                  topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=64,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0))


def hub_layout(named, cfg):
    """transformers' fused expert tensors -> the hub's per-expert names (other names unchanged)."""
    out = {}
    f = cfg["moe_intermediate_size"]
    for n, t in named:
        if n.endswith("mlp.experts.gate_up_proj"):
            base = n[: -len("gate_up_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :f]
                out[f"{base}{e}.up_proj.weight"] = t[e, f:]
        elif n.endswith("mlp.experts.down_proj"):
            base = n[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e]
        else:
            out[n] = t
    return out


def check_routing_margins(model, cfg, tokens):
    """Every MoE layer's choice (groups, then experts) must not hinge on f32 rounding, and the bias
    must change some token's choice (else the fixture would not test it)."""
    captured = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, key=n: captured.__setitem__(key, inp[0]))
             for n, m in model.named_modules() if n.endswith("mlp.gate")]
    with torch.no_grad():
        model(input_ids=tokens)
    for h in hooks:
        h.remove()
    k, g, kg, e = cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"], cfg["n_routed_experts"]
    changed = 0
    for name, x in captured.items():
        gate = dict(model.named_modules())[name]
        scores = torch.sigmoid(x.reshape(-1, x.shape[-1]).double() @ gate.weight.double().t())
        biased = scores + gate.e_score_correction_bias.double()
        group = biased.view(-1, g, e // g).topk(2, dim=-1)[0].sum(-1).sort(dim=-1, descending=True)[0]
        assert (group[:, kg - 1] - group[:, kg]).min() > 1e-4, f"{name}: a group choice is a near tie"
        top = biased.sort(dim=-1, descending=True)[0]
        assert (top[:, k - 1] - top[:, k]).min() > 1e-4, f"{name}: an expert choice is a near tie"
        changed += int((scores.topk(k).indices.sort().values != biased.topk(k).indices.sort().values).any(-1).sum())
    assert changed > 0, "the expert bias never changes a choice"
    print(f"routing margins ok; the bias changes {changed} token choices")


def write_fixture(root, name, cfg, seed):
    out_dir = root / "tests/fixtures" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    config = DeepseekV3Config(**cfg)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the per-expert loop (grouped_mm has no float64)
    model = DeepseekV3ForCausalLM(config).double().eval()
    # Weights rounded to f32 first, so the f32 checkpoint holds exactly what float64 evaluated.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:  # not all ones: norms are really tested
                t = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                t = 0.08 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(t.float().double())
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):  # nonzero, so that the choice depends on it
                b.copy_((0.15 * torch.randn(b.shape, generator=gen, dtype=torch.float64)).float().double())
    data = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ + 1), generator=gen)
    tokens, targets = data[:, :-1], data[:, 1:].reshape(-1).clone()
    targets[5] = -100  # an ignored position
    if cfg["first_k_dense_replace"] < cfg["num_hidden_layers"]:
        check_routing_margins(model, cfg, tokens)
    logits = model(input_ids=tokens).logits.reshape(BATCH * SEQ, -1)
    loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
    loss.backward()
    grads = hub_layout(((n, p.grad) for n, p in model.named_parameters()), cfg)
    golden = {f"grad.{n}": g.float().contiguous() for n, g in grads.items()}
    golden["tokens"] = tokens.to(torch.int32).contiguous()
    golden["targets"] = targets.to(torch.int32).contiguous()
    golden["logits"] = logits.detach().float().contiguous()
    golden["loss"] = loss.detach().float().reshape(1)
    save_file(golden, str(out_dir / "golden.safetensors"), metadata={"generator": "reference/deepseek_v3.py"})
    # The checkpoint as Hugging Face stores DeepSeek-V3 (hub layout of config.json, f32 weights).
    tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n.endswith("_bias")]
    weights = {n: t.detach().float().contiguous() for n, t in hub_layout(tensors, cfg).items()}
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    rp = cfg["rope_parameters"]
    hub_config = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    hub_config.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_act="silu",
                      rope_theta=rp["rope_theta"], torch_dtype="float32", scoring_func="sigmoid",
                      topk_method="noaux_tc", rope_scaling=None)
    if rp["rope_type"] == "yarn":
        hub_config["rope_scaling"] = {"type": "yarn", "factor": rp["factor"], "beta_fast": rp["beta_fast"],
                                      "beta_slow": rp["beta_slow"], "mscale": rp["mscale"],
                                      "mscale_all_dim": rp["mscale_all_dim"],
                                      "original_max_position_embeddings": rp["original_max_position_embeddings"]}
    (out_dir / "config.json").write_text(json.dumps(hub_config, indent=2) + "\n")
    size = sum(f.stat().st_size for f in out_dir.iterdir())
    print(f"wrote {out_dir} ({size} bytes); loss {loss.item():.6f}")


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    write_fixture(root, "deepseek_v3_tiny", CONFIG, 4321)
    write_fixture(root, "deepseek_v3_tiny_plain_q", PLAIN_Q_CONFIG, 8765)
    write_fixture(root, "deepseek_v3_tiny_moe", MOE_CONFIG, 2468)


if __name__ == "__main__":
    main()
