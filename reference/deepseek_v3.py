"""Golden fixture for the DeepSeek-V3 model (dense part): a tiny DeepseekV3ForCausalLM from Hugging
Face transformers with every layer dense (first_k_dense_replace = num_hidden_layers), random
weights, evaluated in float64. Writes tests/fixtures/deepseek_v3_tiny/ in Hugging Face's layout
(config.json + model.safetensors, f32 weights) plus golden.safetensors: tokens, targets, logits,
loss and the gradient of every weight under its Hugging Face name. The C++ parity test loads the
folder through the HF adapter and must match.

Two folders: deepseek_v3_tiny covers the low-rank query path (q_lora_rank > 0) and YaRN with
mscale == mscale_all_dim != 1 (the softmax-scale factor); deepseek_v3_tiny_plain_q covers the plain
q_proj (q_lora_rank = None) without rope scaling. Both use HF's interleaved RoPE (rope_interleave =
True, the layout of DeepSeek's checkpoints) and rms_norm_eps = 1e-6 (HF's q/kv latent norms always
use 1e-6).

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


def write_fixture(root, name, cfg, seed):
    out_dir = root / "tests/fixtures" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    config = DeepseekV3Config(**cfg)
    config._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(config).double().eval()
    # Weights rounded to f32 first, so the f32 checkpoint holds exactly what float64 evaluated.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:  # not all ones: norms are really tested
                t = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                t = 0.08 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(t.float().double())
    data = torch.randint(0, cfg["vocab_size"], (BATCH, SEQ + 1), generator=gen)
    tokens, targets = data[:, :-1], data[:, 1:].reshape(-1).clone()
    targets[5] = -100  # an ignored position
    logits = model(input_ids=tokens).logits.reshape(BATCH * SEQ, -1)
    loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)
    loss.backward()
    golden = {f"grad.{n}": p.grad.float().contiguous() for n, p in model.named_parameters()}
    golden["tokens"] = tokens.to(torch.int32).contiguous()
    golden["targets"] = targets.to(torch.int32).contiguous()
    golden["logits"] = logits.detach().float().contiguous()
    golden["loss"] = loss.detach().float().reshape(1)
    save_file(golden, str(out_dir / "golden.safetensors"), metadata={"generator": "reference/deepseek_v3.py"})
    # The checkpoint as Hugging Face stores DeepSeek-V3 (hub layout of config.json, f32 weights).
    weights = {n: p.detach().float().contiguous() for n, p in model.named_parameters()}
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


if __name__ == "__main__":
    main()
