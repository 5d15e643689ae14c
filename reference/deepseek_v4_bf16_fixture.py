"""bf16 golden for titan's DeepSeek-V4 mixed precision: transformers' DeepseekV4ForCausalLM loaded
in bfloat16 from the f32 fixture folder (reference/deepseek_v4_fixture.py), so its fp32 islands
(../shared/reference/v4_transformers.md section 7: norms, mHC, sinks, position biases) stay f32 and
everything else runs bf16, on the f32 golden's input_ids. Saves, next to it,
golden_bf16.safetensors: logits, loss and every parameter's gradient (grad.<name>, as f32).

    python reference/deepseek_v4_bf16_fixture.py tests/fixtures/deepseek_v4_tiny
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4ForCausalLM


def main(folder):
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="eager")
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    input_ids = load_file(os.path.join(folder, "golden.safetensors"))["input_ids"].long()
    result = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    result.loss.backward()
    golden = {"logits": result.logits.detach().float(), "loss": result.loss.detach().float().reshape(1)}
    for name, p in model.named_parameters():
        golden["grad." + name] = (p.grad if p.grad is not None else torch.zeros_like(p)).float()
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(folder, "golden_bf16.safetensors"))
    print(f"bf16 loss {result.loss.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/deepseek_v4_tiny")
