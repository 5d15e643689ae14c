"""Golden fixture for titan's DeepSeek-V4 multi-token prediction (src/titan/models/deepseek_v4/mtp.h).

transformers builds no MTP module (spec section 5), so one is assembled here from transformers' own
V4 classes, as DeepSeek's reference MTPBlock composes it:
    X'   = e_proj(enorm(embed(t_{i+1}))) in every stream + h_proj(hnorm(X_main))   (hnorm per stream)
    X    = DeepseekV4DecoderLayer(X')     sliding-window attention, learned-routing MoE
    logits = lm_head(norm(DeepseekV4HyperHead(X)))                                 the shared head
X_main is the main model's final stream before its hc_head; the module at position i embeds token
i + 1 (0 past the row) and is scored against token i + 2 (DeepSeek-V3's shift). The training loss is
loss + MTP_WEIGHT * mtp_loss (one module). A two-layer model (sliding + HCA, hash + learned routing),
f32, zero / one inits randomised as deepseek_v4_fixture.py does. Saved to OUT:
  config.json: the main model's (transformers');
  model.safetensors: model.state_dict() and the module's under "model.mtp.0." (transformers-style
    layer names, as titan's export writes it; transformers ignores "mtp.*" on load);
  golden.safetensors: input_ids, logits, loss, mtp_loss, total, and every parameter's gradient of
    the total (grad.<name>).

    python reference/deepseek_v4_mtp_fixture.py tests/fixtures/deepseek_v4_tiny_mtp
"""
import copy
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import DeepseekV4ForCausalLM
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepseek_v4_fixture import build_config as fixture_config, randomise  # noqa: E402

BATCH, SEQ, SEED, MTP_WEIGHT = 2, 19, 3, 0.3


def build_config():
    # deepseek_v4_fixture.py's model with two layers (sliding + HCA, hash + learned routing) and a
    # vocabulary of 64. S = 19: HCA has 2 entries (a 3-token tail), S > W.
    return fixture_config(vocab_size=64, num_hidden_layers=2,
                          layer_types=["sliding_attention", "heavily_compressed_attention"],
                          mlp_layer_types=["hash_moe", "moe"])


class Mtp(torch.nn.Module):
    """One MTP module (DeepSeek's MTPBlock) from transformers' V4 pieces; layer id num_hidden_layers."""

    def __init__(self, config):
        super().__init__()
        layer_config = copy.deepcopy(config)  # one more layer: sliding-window, learned routing
        layer_config.layer_types = list(config.layer_types) + ["sliding_attention"]
        layer_config.mlp_layer_types = list(config.mlp_layer_types) + ["moe"]
        layer_config.num_hidden_layers = config.num_hidden_layers + 1
        d = config.hidden_size
        self.layer = v4.DeepseekV4DecoderLayer(layer_config, config.num_hidden_layers)
        self.e_proj = torch.nn.Linear(d, d, bias=False)
        self.h_proj = torch.nn.Linear(d, d, bias=False)
        self.enorm = v4.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)
        self.hnorm = v4.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)
        self.hc_head = v4.DeepseekV4HyperHead(config)
        self.norm = v4.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)

    def forward(self, x_main, emb, ids, layer_kwargs):
        x = self.e_proj(self.enorm(emb)).unsqueeze(2) + self.h_proj(self.hnorm(x_main))  # [B, S, N, d]
        x = self.layer(x, input_ids=ids, **layer_kwargs)
        return self.norm(self.hc_head(x))

    def state_names(self):
        """The module's state under transformers-style layer names (the layer's own at top level)."""
        out = {}
        for name, t in self.state_dict().items():
            out[name[len("layer."):] if name.startswith("layer.") else name] = t
        return out


def main(out):
    config = build_config()
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = DeepseekV4ForCausalLM(config).float()
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    mtp = Mtp(config).float()
    with torch.no_grad():
        for p in mtp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * config.initializer_range)
        for name, b in mtp.named_buffers():
            if name.endswith("tid2eid"):
                b.zero_()
    randomise(model, config, gen)
    randomise(mtp, config, gen)
    if hasattr(mtp.layer.mlp.experts, "experts_implementation"):
        mtp.layer.mlp.experts.experts_implementation = "eager"
    input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=gen)

    captured = {}
    model.model.hc_head.register_forward_pre_hook(lambda m, args: captured.__setitem__("x_main", args[0]))

    def keep_kwargs(module, args, kwargs):
        captured["kwargs"] = {k: v for k, v in kwargs.items() if k in ("position_embeddings", "position_ids",
                                                                          "attention_mask")}
    model.model.layers[0].register_forward_pre_hook(keep_kwargs, with_kwargs=True)
    result = model(input_ids=input_ids, labels=input_ids, use_cache=False)

    shifted = torch.zeros_like(input_ids)
    shifted[:, :-1] = input_ids[:, 1:]  # t_{i+1}; 0 past the row
    labels = torch.full_like(input_ids, -100)
    labels[:, :-2] = input_ids[:, 2:]  # t_{i+2}
    mtp_hidden = mtp(captured["x_main"], model.model.embed_tokens(shifted), shifted, captured["kwargs"])
    mtp_logits = model.lm_head(mtp_hidden).float()
    mtp_loss = F.cross_entropy(mtp_logits.reshape(-1, config.vocab_size), labels.reshape(-1), ignore_index=-100)
    total = result.loss + MTP_WEIGHT * mtp_loss
    total.backward()

    golden = {"input_ids": input_ids.to(torch.int32), "logits": result.logits.detach(),
              "loss": result.loss.detach().reshape(1), "mtp_loss": mtp_loss.detach().reshape(1),
              "total": total.detach().reshape(1)}
    for name, p in model.named_parameters():
        golden["grad." + name] = p.grad if p.grad is not None else torch.zeros_like(p)
    state = dict(model.state_dict())
    mtp_grads = {(n[len("layer."):] if n.startswith("layer.") else n): p.grad for n, p in mtp.named_parameters()}
    for name, t in mtp.state_names().items():
        state["model.mtp.0." + name] = t
        if name in mtp_grads:
            golden["grad.model.mtp.0." + name] = mtp_grads[name]
    os.makedirs(out, exist_ok=True)
    config.to_json_file(os.path.join(out, "config.json"))
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out, "model.safetensors"))
    save_file({k: v.contiguous().float() if v.dtype != torch.int32 else v.contiguous() for k, v in golden.items()},
              os.path.join(out, "golden.safetensors"))
    print(f"loss {result.loss.item():.6f} mtp_loss {mtp_loss.item():.6f} total {total.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
