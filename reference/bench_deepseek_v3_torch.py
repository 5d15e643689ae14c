"""PyTorch side of `bench_train_step --model deepseek_v3`: builds Hugging Face transformers'
DeepseekV3ForCausalLM from the config.json our HF export writes for the flavor (the C++ benchmark
passes it), trains it with AdamW for a few steps on random tokens in PyTorch eager (f32, or bf16
autocast as the Llama-3 twin does), and prints one JSON line with tokens/s and peak resident memory.

What "eager" is here: eager attention (transformers' eager_attention_forward: the [S, S] scores
materialized, softmax, then the values) and the "eager" experts implementation, a Python loop over
the experts that received tokens (index the tokens, gate_up linear, SwiGLU, down linear, scale,
index_add). The router runs in f32 as ours does. transformers' router always takes the sigmoid;
flavors routed by softmax (TorchTitan's debugmodel) get a softmax router here, so both sides pick
experts the same way.

    reference/.venv/bin/python reference/bench_deepseek_v3_torch.py --config /tmp/flavor.json \
        --batch 2 --seq 512 --steps 3 --dtype float32
"""
import argparse
import json
import resource
import types

import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from bench_torch_step import time_training


def softmax_router_forward(self, hidden_states):
    """TorchTitan's softmax routing: top-k of softmax(logits) (+ the bias, which only steers the
    choice), weights gathered from the scores, optionally renormalized, then scaled."""
    logits = F.linear(hidden_states.view(-1, self.hidden_dim).float(), self.weight.float())
    scores = logits.softmax(dim=-1)
    indices = torch.topk(scores + self.e_score_correction_bias, k=self.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, indices)
    if self.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, weights * self.routed_scaling_factor, indices


def build_model(path):
    hub = json.loads(open(path).read())
    rope = hub.pop("rope_scaling", None)
    params = {"rope_type": "default", "rope_theta": hub["rope_theta"]}
    if rope:
        params = {"rope_type": "yarn", "rope_theta": hub["rope_theta"], **{k: v for k, v in rope.items() if k != "type"}}
    scoring = hub.pop("scoring_func", "sigmoid")
    keep = {k: v for k, v in hub.items() if k not in ("architectures", "model_type", "torch_dtype", "topk_method",
                                                      "moe_layer_freq", "rope_theta")}
    config = DeepseekV3Config(**keep, rope_parameters=params)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    model = DeepseekV3ForCausalLM(config)
    for module in model.modules():
        if type(module).__name__ == "DeepseekV3TopkRouter":
            torch.nn.init.normal_(module.weight, std=0.02)  # not the zeros transformers starts from: real routing
            if scoring == "softmax":
                assert module.num_group == 1, "the softmax router here has no group-limited routing"
                module.forward = types.MethodType(softmax_router_forward, module)
    return model, config


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, help="config.json in Hugging Face's DeepSeek-V3 layout")
    for k, v in dict(batch=2, seq=512, steps=3).items():
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args()
    torch.manual_seed(0)
    # From before the model exists, as the C++ side counts: parameters, gradients, AdamW state, activations.
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model, config = build_model(a.config)
    model.train()
    vocab = config.vocab_size
    tokens = torch.randint(0, vocab, (a.batch, a.seq + 1))
    time_training(model, lambda x: model(input_ids=x, use_cache=False).logits, tokens, vocab, a.dtype, a.steps, rss0,
                  mode="eager", parameters=sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()
