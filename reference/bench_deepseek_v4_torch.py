"""PyTorch side of `bench_train_step --model deepseek_v4`: builds Hugging Face transformers'
DeepseekV4ForCausalLM from the config.json titan's hf_config(args) writes for the flavor (the C++
benchmark passes it), trains it with AdamW on random tokens in PyTorch eager, f32 or bf16 autocast (f32 masters, as
titan's mixed precision; transformers' own fp32 casts stay f32), and prints one
JSON line with tokens/s and peak resident memory (reference/bench_torch_step.py's time_training).

What "eager" is here: attn_implementation="eager" (transformers' own V4 attention, window +
compressed entries + sink, in plain torch ops) and the "eager" experts implementation, a Python
loop over the experts that received tokens. transformers' CSA indexer gives no gradient (its
top-k is a constant mask); titan's indexer trains with its KL loss (coeff 0.01), so titan does
that extra work here.

Hash-routed layers: transformers (and titan) start tid2eid at zeros, which sends every token to
expert 0. Both sides of the benchmark fill it with the same balanced table instead,
tid2eid[v, j] = (v * K + j) % E, so that hash layers route as a real checkpoint does.

    python3 reference/bench_deepseek_v4_torch.py --config /tmp/flavor.json --batch 4 --seq 256 --steps 3
"""
import argparse
import json
import resource

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

from bench_torch_step import time_training


def build_model(path):
    config = DeepseekV4Config.from_json_file(path)
    config._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(config).float()
    model.set_experts_implementation("eager")
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("tid2eid"):
                v, k = b.shape
                ids = torch.arange(v * k, dtype=torch.long).reshape(v, k)
                b.copy_(ids % config.n_routed_experts)
    return model, config


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, help="config.json in transformers' DeepSeek-V4 layout")
    for k, v in dict(batch=4, seq=256, steps=3).items():
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
