"""Golden fixture for titan's DeepSeek-V4 MoE block (src/titan/models/deepseek_v4/moe.h):
transformers' DeepseekV4SparseMoeBlock (eager experts, f32) as a learned-routing "moe" layer and a
"hash_moe" layer, sqrtsoftplus scores, on 13 random tokens, with random (non-initial) weights, a
random e_score_correction_bias, a tid2eid of distinct expert pairs and a swiglu_limit small enough
that both clamps bite; the outputs and the gradients of a fixed probe loss with respect to the
input and every parameter. Tensors keep transformers' names and layouts, prefixed by the layer.

    python reference/v4_moe_fixture.py tests/fixtures/v4_moe.safetensors
"""
import sys

import torch
from safetensors.torch import save_file
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4SparseMoeBlock

TOKENS, DIM, EXPERTS, TOP_K, WIDTH, VOCAB, LIMIT, SCALE = 13, 16, 8, 2, 8, 32, 0.8, 1.5
LAYERS = ("moe", "hash_moe")
TIE_MARGIN = 1e-3  # the K-th and (K+1)-th biased scores must differ by this much


def make_config():
    config = DeepseekV4Config(
        vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=len(LAYERS), mlp_layer_types=list(LAYERS),
        moe_intermediate_size=WIDTH, n_routed_experts=EXPERTS, num_experts_per_tok=TOP_K,
        routed_scaling_factor=SCALE, swiglu_limit=LIMIT, scoring_func="sqrtsoftplus")
    config._experts_implementation = "eager"
    return config


def randomise(block, is_hash):
    with torch.no_grad():
        block.gate.weight.copy_(torch.randn_like(block.gate.weight) * 0.5)
        block.experts.gate_up_proj.copy_(torch.randn_like(block.experts.gate_up_proj) * 0.4)
        block.experts.down_proj.copy_(torch.randn_like(block.experts.down_proj) * 0.4)
        for lin in (block.shared_experts.gate_proj, block.shared_experts.up_proj, block.shared_experts.down_proj):
            lin.weight.copy_(torch.randn_like(lin.weight) * 0.4)
        if is_hash:
            block.gate.tid2eid.copy_(torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(VOCAB)]))
        else:
            block.gate.e_score_correction_bias.copy_(torch.randn(EXPERTS) * 0.3)


def check_margins(block, h):
    """No near-ties at the top-K boundary, and the bias changes some token's choice."""
    with torch.no_grad():
        scores = torch.sqrt(torch.nn.functional.softplus(h @ block.gate.weight.T))
        biased = (scores + block.gate.e_score_correction_bias).sort(dim=-1, descending=True).values
        margin = (biased[:, TOP_K - 1] - biased[:, TOP_K]).min().item()
        assert margin > TIE_MARGIN, f"near-tie at the top-{TOP_K} boundary ({margin}): change the seed"
        unbiased = scores.topk(TOP_K).indices.sort().values
        chosen = (scores + block.gate.e_score_correction_bias).topk(TOP_K).indices.sort().values
        assert (unbiased != chosen).any(), "the bias steers no choice: raise its scale"


def clamped_fractions(block, h):
    with torch.no_grad():
        gate, up = (h @ block.experts.gate_up_proj.reshape(-1, DIM).T).reshape(TOKENS, EXPERTS, 2, WIDTH).unbind(2)
        return (gate > LIMIT).float().mean().item(), (up.abs() > LIMIT).float().mean().item()


def main(out):
    torch.manual_seed(0)
    config = make_config()
    h = torch.randn(1, TOKENS, DIM)
    ids = torch.randint(0, VOCAB, (1, TOKENS))
    t = {"h": h[0], "ids": ids[0].to(torch.int32)}
    for layer, kind in enumerate(LAYERS):
        block = DeepseekV4SparseMoeBlock(config, layer).float()
        randomise(block, kind == "hash_moe")
        if kind == "moe":
            check_margins(block, h[0])
        gate_frac, up_frac = clamped_fractions(block, h[0])
        assert gate_frac > 0.1 and up_frac > 0.1, (gate_frac, up_frac)
        x = h.clone().requires_grad_(True)
        y = block(x, input_ids=ids)
        probe = torch.randn_like(y)
        (y * probe).sum().backward()
        p = kind + "."
        t[p + "probe"] = probe[0]
        t[p + "out"] = y.detach()[0]
        t[p + "grad.h"] = x.grad[0]
        for name, value in block.state_dict().items():
            t[p + name] = value
        for name, param in block.named_parameters():
            t[p + "grad." + name] = param.grad
        print(f"{kind}: gate clamped {gate_frac:.2f}, up clamped {up_frac:.2f}")
    save_file({k: v.detach().contiguous() if v.dtype in (torch.int32, torch.int64) else v.detach().contiguous().float()
               for k, v in t.items()}, out)


if __name__ == "__main__":
    main(sys.argv[1])
