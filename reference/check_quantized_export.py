"""Checks that transformers reads titan's quantized Hugging Face exports (`titan ckpt convert
--to-hf --quantize fp8 | fp8-fp4`) to the same weights titan's own import does.

For each fixture folder: titan converts it to a checkpoint, exports that quantized (Q) and, after
importing Q back, exports the dequantized result in f32 (D). transformers then loads Q (through its
FP8 integration, dequantizing on the CPU) and D; every tensor must be equal.

    python reference/check_quantized_export.py build/titan

Needs torch, transformers and accelerate (reference/requirements.txt).
"""
import os
import subprocess
import sys
import tempfile

import torch
import transformers

CASES = [  # fixture, model class, --quantize
    ("tests/fixtures/deepseek_v3_tiny_moe", "DeepseekV3ForCausalLM", "fp8"),
    ("tests/fixtures/deepseek_v4_tiny", "DeepseekV4ForCausalLM", "fp8"),
    ("tests/fixtures/deepseek_v4_tiny", "DeepseekV4ForCausalLM", "fp8-fp4"),
]


def titan(binary, *args):
    subprocess.run([binary, "ckpt", "convert", *args], check=True, stdout=subprocess.DEVNULL)


def main(binary):
    failures = 0
    for fixture, cls, quantize in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            q, d = os.path.join(tmp, "q"), os.path.join(tmp, "d")
            titan(binary, "--from-hf", fixture, "--to", os.path.join(tmp, "c"))
            titan(binary, "--from", os.path.join(tmp, "c"), "--to-hf", q, "--quantize", quantize)
            titan(binary, "--from-hf", q, "--to", os.path.join(tmp, "cq"))
            titan(binary, "--from", os.path.join(tmp, "cq"), "--to-hf", d, "--dtype", "f32")
            model = getattr(transformers, cls)
            theirs = model.from_pretrained(q, dtype=torch.float32).state_dict()
            ours = model.from_pretrained(d, dtype=torch.float32).state_dict()
            assert theirs.keys() == ours.keys(), set(theirs.keys()) ^ set(ours.keys())
            differ = [n for n in ours if not torch.equal(theirs[n].float(), ours[n].float())]
            print(f"{fixture} --quantize {quantize}: {len(ours)} tensors, {len(differ)} differ"
                  + (f" (e.g. {differ[0]})" if differ else ""))
            failures += bool(differ)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/titan")
