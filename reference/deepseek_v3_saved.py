"""Fixtures for `titan ckpt convert --from-hf` on the two kinds of DeepSeek-V3 folders there are:

  tests/fixtures/deepseek_v3_tiny_saved/      exactly what transformers' save_pretrained writes for a
      DeepseekV3ForCausalLM: config.json keeps num_nextn_predict_layers = 1 (DeepseekV3Config's
      default) but model.safetensors holds no MTP weights (transformers has no MTP module).
  tests/fixtures/deepseek_v3_tiny_saved_mtp/  the same save_pretrained folder plus the MTP layer as
      DeepSeek's hub checkpoints hold it: model.layers.<num_hidden_layers>.{enorm, hnorm, eh_proj,
      shared_head.norm, shared_head.head, embed_tokens} and a full decoder block (MoE, per-expert
      names), the head and embedding being copies of lm_head and model.embed_tokens.

A tiny MoE model (vocabulary 32, hidden 16, a dense layer then a MoE one, the MTP block MoE as in
DeepSeek-V3), random f32 weights (norms around 1, a nonzero e_score_correction_bias), saved in f32.
Each folder has golden.safetensors: tokens, targets and the logits of transformers' forward in
float64; the _mtp folder adds the MTP module's logits and loss (mtp_forward below: DeepSeek-V3's
MTP as vLLM and SGLang run the hub weights, h' = eh_proj([enorm(emb(t_{i+1})); hnorm(h_i)]), the
block, shared_head.norm, the shared head, scored against t_{i+2}), which transformers cannot compute
itself. The routing margins of every MoE layer, the MTP block's included, are checked far above
the f32 rounding of HF's router logits (see deepseek_v3.py).

    reference/.venv/bin/python reference/deepseek_v3_saved.py   (transformers 5.x; see requirements.txt)
"""
import copy
import pathlib
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, DeepseekV3Model

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deepseek_v3 import hub_layout  # noqa: E402

BATCH, SEQ = 2, 8
CONFIG = dict(
    vocab_size=32, hidden_size=16, intermediate_size=24, moe_intermediate_size=8, num_hidden_layers=2,
    first_k_dense_replace=1, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, n_shared_experts=1,
    num_experts_per_tok=2, n_group=2, topk_group=1, q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=4,
    qk_rope_head_dim=4, v_head_dim=4, max_position_embeddings=64,
)  # num_nextn_predict_layers, routed_scaling_factor, norm_topk_prob, rms_norm_eps: DeepseekV3Config's defaults


def mtp_config(config):
    """A one-layer DeepseekV3Model config whose layer 0 is built like the MTP block (layer n_layers)."""
    c = copy.deepcopy(config)
    c.num_hidden_layers = 1
    c.first_k_dense_replace = 0 if config.first_k_dense_replace <= config.num_hidden_layers else 1
    return c


def mtp_forward(model, mtp, enorm, hnorm, eh_proj, tokens, targets):
    """DeepSeek-V3's first MTP module. `mtp` is a one-layer DeepseekV3Model holding the block (its
    norm is shared_head.norm); enorm / hnorm are RMSNorms, eh_proj a Linear [2D] -> [D]. Position i
    (< S - 1) embeds t_{i+1} and is scored against t_{i+2} = targets[i + 1]. Returns the logits
    [B * (S-1), V] and the mean cross-entropy (ignoring -100)."""
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(lambda mod, inp, out: captured.__setitem__("h", out))
    model(input_ids=tokens)
    hook.remove()
    h = captured["h"][:, :-1]  # the main model's last hidden state, before its final norm
    e = model.model.embed_tokens(tokens[:, 1:])
    x = eh_proj(torch.cat([enorm(e), hnorm(h)], dim=-1))
    logits = model.lm_head(mtp(inputs_embeds=x).last_hidden_state).reshape(-1, model.config.vocab_size)
    mtp_targets = targets.view(tokens.shape)[:, 1:].reshape(-1)
    return logits, torch.nn.functional.cross_entropy(logits, mtp_targets, ignore_index=-100)


def load_mtp(model, weights, dtype):
    """The first MTP module's pieces from hub-layout `weights` (model.layers.<n_layers>.*)."""
    cfg, n = model.config, model.config.num_hidden_layers
    p = f"model.layers.{n}."
    mc = mtp_config(cfg)
    mtp = DeepseekV3Model(mc).to(dtype).eval()
    # The block's weights: hub names -> transformers' fused experts (ours is the inverse of hub_layout).
    f = cfg.moe_intermediate_size
    state = {}
    for name, t in mtp.state_dict().items():
        if name == "norm.weight":
            state[name] = weights[p + "shared_head.norm.weight"]
        elif name == "embed_tokens.weight":
            state[name] = weights["model.embed_tokens.weight"]  # unused (inputs_embeds)
        elif name.endswith("mlp.experts.gate_up_proj"):
            base = p + name[len("layers.0."): -len("gate_up_proj")]
            state[name] = torch.stack([torch.cat([weights[f"{base}{e}.gate_proj.weight"],
                                                  weights[f"{base}{e}.up_proj.weight"]]) for e in range(t.shape[0])])
            assert state[name].shape[1] == 2 * f
        elif name.endswith("mlp.experts.down_proj"):
            base = p + name[len("layers.0."): -len("down_proj")]
            state[name] = torch.stack([weights[f"{base}{e}.down_proj.weight"] for e in range(t.shape[0])])
        else:
            state[name] = weights[p + name[len("layers.0."):]]
    mtp.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    d = cfg.hidden_size
    enorm = type(mtp.norm)(d, eps=cfg.rms_norm_eps).to(dtype)
    hnorm = type(mtp.norm)(d, eps=cfg.rms_norm_eps).to(dtype)
    eh_proj = torch.nn.Linear(2 * d, d, bias=False).to(dtype)
    with torch.no_grad():
        enorm.weight.copy_(weights[p + "enorm.weight"])
        hnorm.weight.copy_(weights[p + "hnorm.weight"])
        eh_proj.weight.copy_(weights[p + "eh_proj.weight"])
    return mtp, enorm, hnorm, eh_proj


def check_margins(gate, x, cfg, what):
    """gate's choice (groups, then experts) for inputs x must not hinge on f32 rounding; returns how
    many token choices the expert bias changes."""
    k, g, kg, e = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group, cfg.n_routed_experts
    scores = torch.sigmoid(x.reshape(-1, x.shape[-1]).double() @ gate.weight.double().t())
    biased = scores + gate.e_score_correction_bias.double()
    group = biased.view(-1, g, e // g).topk(2, dim=-1)[0].sum(-1).sort(dim=-1, descending=True)[0]
    assert (group[:, kg - 1] - group[:, kg]).min() > 1e-4, f"{what}: a group choice is a near tie"
    masked = biased.view(-1, g, e // g).clone()
    chosen = biased.view(-1, g, e // g).topk(2, dim=-1)[0].sum(-1).topk(kg, dim=-1).indices
    keep = torch.zeros(masked.shape[:2], dtype=torch.bool).scatter_(1, chosen, True)
    masked[~keep] = float("-inf")
    top = masked.reshape(-1, e).sort(dim=-1, descending=True)[0]
    assert (top[:, k - 1] - top[:, k]).min() > 1e-4, f"{what}: an expert choice is a near tie"
    return int((scores.topk(k).indices.sort().values != biased.topk(k).indices.sort().values).any(-1).sum())


def gate_inputs(module, run):
    """The inputs of every router under `module` during run()."""
    captured = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, key=n: captured.__setitem__(key, (mod, inp[0])))
             for n, m in module.named_modules() if n.endswith("mlp.gate")]
    run()
    for h in hooks:
        h.remove()
    return captured


def randomize(module, gen, skip_bias=False):
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:  # not all ones: norms are really tested
                t = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            else:
                t = 0.25 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_(t)
        for n, b in module.named_buffers():
            if n.endswith("e_score_correction_bias"):  # nonzero, so that the choice depends on it
                b.copy_(0.15 * torch.randn(b.shape, generator=gen, dtype=torch.float64))


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    saved, with_mtp = root / "tests/fixtures/deepseek_v3_tiny_saved", root / "tests/fixtures/deepseek_v3_tiny_saved_mtp"
    gen = torch.Generator().manual_seed(1357)
    torch.manual_seed(1357)
    config = DeepseekV3Config(**CONFIG)
    assert config.num_nextn_predict_layers == 1  # transformers' default, which save_pretrained writes
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the per-expert loop (grouped_mm has no float64)
    model = DeepseekV3ForCausalLM(config).eval()  # f32, so save_pretrained writes f32 weights
    randomize(model, gen)
    for d in (saved, with_mtp):
        shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(saved)

    # The MTP layer, as DeepSeek's hub checkpoints lay it out.
    n = config.num_hidden_layers
    mtp = DeepseekV3Model(mtp_config(config)).eval()
    randomize(mtp, gen)
    mtp_weights = {f"model.layers.{n}.{k[len('layers.0.'):]}": v for k, v in
                   hub_layout(list(mtp.state_dict().items()), CONFIG).items() if k.startswith("layers.0.")}
    d = config.hidden_size
    mtp_weights[f"model.layers.{n}.enorm.weight"] = 1.0 + 0.1 * torch.randn(d, generator=gen)
    mtp_weights[f"model.layers.{n}.hnorm.weight"] = 1.0 + 0.1 * torch.randn(d, generator=gen)
    mtp_weights[f"model.layers.{n}.eh_proj.weight"] = 0.25 * torch.randn(d, 2 * d, generator=gen)
    mtp_weights[f"model.layers.{n}.shared_head.norm.weight"] = mtp.norm.weight.detach().clone()
    weights = load_file(str(saved / "model.safetensors"))
    mtp_weights[f"model.layers.{n}.shared_head.head.weight"] = weights["lm_head.weight"].clone()
    mtp_weights[f"model.layers.{n}.embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
    shutil.copytree(saved, with_mtp)
    all_weights = dict(weights, **{k: v.float().contiguous() for k, v in mtp_weights.items()})
    save_file(dict(sorted(all_weights.items())), str(with_mtp / "model.safetensors"), metadata={"format": "pt"})

    # Goldens in float64 (the f32 weights exactly).
    model = model.double()
    data = torch.randint(0, config.vocab_size, (BATCH, SEQ + 1), generator=gen)
    tokens, targets = data[:, :-1], data[:, 1:].reshape(-1).clone()
    targets[5] = -100  # an ignored position (also the MTP target of position 4)
    mtp_parts = load_mtp(model, all_weights, torch.float64)
    with torch.no_grad():
        changed = 0
        for name, (gate, x) in gate_inputs(model, lambda: model(input_ids=tokens)).items():
            changed += check_margins(gate, x, config, name)
        for name, (gate, x) in gate_inputs(mtp_parts[0], lambda: mtp_forward(model, *mtp_parts, tokens, targets)).items():
            changed += check_margins(gate, x, config, "mtp " + name)
        assert changed > 0, "the expert bias never changes a choice"
        logits = model(input_ids=tokens).logits.reshape(BATCH * SEQ, -1)
        mtp_logits, mtp_loss = mtp_forward(model, *mtp_parts, tokens, targets)
    golden = {"tokens": tokens.to(torch.int32).contiguous(), "targets": targets.to(torch.int32).contiguous(),
              "logits": logits.float().contiguous()}
    save_file(golden, str(saved / "golden.safetensors"), metadata={"generator": "reference/deepseek_v3_saved.py"})
    golden.update(mtp_logits=mtp_logits.float().contiguous(), mtp_loss=mtp_loss.float().reshape(1))
    save_file(golden, str(with_mtp / "golden.safetensors"), metadata={"generator": "reference/deepseek_v3_saved.py"})
    for d in (saved, with_mtp):
        size = sum(f.stat().st_size for f in d.iterdir())
        print(f"wrote {d} ({size} bytes)")
    print(f"the bias changes {changed} token choices; MTP loss {mtp_loss.item():.6f}")


if __name__ == "__main__":
    main()
