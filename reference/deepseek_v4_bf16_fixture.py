"""bf16 golden for titan's DeepSeek-V4 mixed precision: transformers' DeepseekV4ForCausalLM loaded
in bfloat16 from the f32 fixture folder (reference/deepseek_v4_fixture.py), so its fp32 islands
(../shared/reference/v4_transformers.md section 7: norms, mHC, sinks, position biases) stay f32 and
everything else runs bf16, on the f32 golden's input_ids. Saves, next to it:

  golden_bf16.safetensors: logits, loss and every parameter's gradient (grad.<name>, as f32).
  golden_bf16_unclamped.safetensors: the same model with swiglu_limit = 10 (V4's default; the
    fixture's 0.1 clamps about a fifth of the experts' gate and a third of their up values), where
    no expert value comes near the clamp: transformers' own bf16 error against its f32 run, per
    tensor (error.logits, error.loss, error.grad.<name>: relative Frobenius, shape [1]). At 0.1
    a bf16 run moves a few of the ~1,200 values per expert across the clamp, and each such
    value switches its token's gradient on or off; which tensors that hits depends on where each
    implementation rounds, so only the unclamped model gives a per-tensor yardstick.

    python reference/deepseek_v4_bf16_fixture.py tests/fixtures/deepseek_v4_tiny
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4ForCausalLM

UNCLAMPED_LIMIT = 10.0


def run(folder, input_ids, dtype, **config):
    """Logits, loss and every parameter's gradient (f32) of the fixture loaded in `dtype`."""
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager", **config)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    result = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    result.loss.backward()
    out = {"logits": result.logits.detach().float(), "loss": result.loss.detach().float().reshape(1)}
    for name, p in model.named_parameters():
        out["grad." + name] = (p.grad if p.grad is not None else torch.zeros_like(p)).float()
    return out


def relative_error(a, b):
    """|a - b| / |b| (Frobenius), |a - b| where b is 0: as tests/common/relative_error.h."""
    norm = b.double().norm()
    diff = (a.double() - b.double()).norm()
    return float(diff / norm) if norm > 0 else float(diff)


def main(folder):
    input_ids = load_file(os.path.join(folder, "golden.safetensors"))["input_ids"].long()
    golden = run(folder, input_ids, torch.bfloat16)
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(folder, "golden_bf16.safetensors"))
    print(f"bf16 loss {golden['loss'].item():.6f}")

    f32 = run(folder, input_ids, torch.float32, swiglu_limit=UNCLAMPED_LIMIT)
    bf16 = run(folder, input_ids, torch.bfloat16, swiglu_limit=UNCLAMPED_LIMIT)
    errors = {"error." + k: torch.tensor([relative_error(bf16[k], v)], dtype=torch.float32) for k, v in f32.items()}
    save_file(errors, os.path.join(folder, "golden_bf16_unclamped.safetensors"))
    print(f"unclamped: bf16 loss error {errors['error.loss'].item():.3g}, logits {errors['error.logits'].item():.3g}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/deepseek_v4_tiny")
