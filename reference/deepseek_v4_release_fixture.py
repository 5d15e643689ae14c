"""Fixture for importing DeepSeek-V4 in its release layout (../shared/reference/v4_transformers.md
6.2 and 6.4): the tiny golden model of tests/fixtures/deepseek_v4_tiny written as DeepSeek
publishes V4-Flash, then read back by transformers, whose dequantized weights are the answer.

The release layout, as transformers' conversion mapping and FP8 integration read it:
  - DeepSeek's names without the "model." prefix (embed.weight, head.weight, hc_head_fn,
    layers.N.attn.wq_a.weight, layers.N.ffn.experts.E.w1.weight, ...);
  - the attention's and shared experts' matrices in FP8 E4M3 with one UE8M0 scale per 128 x 128
    block under "<module>.scale" (transformers renames it <module>.weight_scale_inv);
  - the routed experts' matrices in FP4 E2M1, two per int8 byte (low nibble = even column), with
    one UE8M0 scale per 1 x 32 block of a row (the block is what the scale grid implies: a 16-wide
    matrix has one 1 x 16 block per row);
  - compressor and indexer projections, the embedding and the head in bf16; norms, mHC, sinks,
    position biases and the router's bias in f32; the hash table as int64.

Writes, into the folder given (tests/fixtures/deepseek_v4_release):
  config.json (the tiny config plus its quantization_config), model.safetensors (the release
  layout), expected.safetensors (transformers' state_dict after loading that folder in f32, the
  FP8 / FP4 weights dequantized by transformers itself: the tensors whose values the storage
  changed, under transformers' names; the others equal the tiny model's).

    python reference/deepseek_v4_release_fixture.py tests/fixtures/deepseek_v4_release

Needs accelerate besides torch and transformers (transformers' FP8 loader requires it).
"""
import json
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DeepseekV4ForCausalLM

SOURCE = "tests/fixtures/deepseek_v4_tiny"
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def release_name(saved):
    """DeepSeek's name of a tensor save_pretrained wrote (it keeps most of DeepSeek's naming)."""
    name = saved[len("model."):] if saved.startswith("model.") else saved
    if name == "embed_tokens.weight":
        return "embed.weight"
    if name.startswith("hc_head.hc_"):
        return "hc_head_" + name[len("hc_head.hc_"):]
    return name


def power_of_two_scale(amax, top):
    """UE8M0: the smallest power of two s with amax / s <= top (1 for an all-zero block)."""
    if amax == 0:
        return 1.0
    return float(2.0 ** torch.ceil(torch.log2(torch.tensor(amax / top, dtype=torch.float64))).item())


def quantize_fp8(w, block=128):
    rows, cols = w.shape
    sr, sc = -(-rows // block), -(-cols // block)
    scale = torch.empty(sr, sc)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(sr):
        for j in range(sc):
            tile = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            s = power_of_two_scale(tile.abs().max().item(), 448.0)
            scale[i, j] = s
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = (tile / s).to(torch.float8_e4m3fn)
    return q, scale.to(torch.float8_e8m0fnu)


def quantize_fp4(w, block=32):
    rows, cols = w.shape
    block = min(block, cols)
    assert cols % block == 0 and cols % 2 == 0
    scale = torch.empty(rows, cols // block)
    codes = torch.empty(rows, cols, dtype=torch.uint8)
    for j in range(cols // block):
        tile = w[:, j * block:(j + 1) * block]
        for i in range(rows):
            s = power_of_two_scale(tile[i].abs().max().item(), 6.0)
            scale[i, j] = s
            x = tile[i] / s
            magnitude = (x.abs().unsqueeze(-1) - E2M1).abs().argmin(-1).to(torch.uint8)
            codes[i, j * block:(j + 1) * block] = magnitude | ((x < 0).to(torch.uint8) << 3)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # low nibble: the even column
    return packed.view(torch.int8), scale.to(torch.float8_e8m0fnu)


FP8 = (".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight", ".attn.wo_a.weight", ".attn.wo_b.weight",
       ".shared_experts.w1.weight", ".shared_experts.w2.weight", ".shared_experts.w3.weight")
BF16 = ("embed.weight", "head.weight", "compressor.wkv.weight", "compressor.wgate.weight", "indexer.wq_b.weight",
        "indexer.weights_proj.weight", "ffn.gate.weight")


def main(out):
    os.makedirs(out, exist_ok=True)
    release, low_precision = {}, []
    with safe_open(os.path.join(SOURCE, "model.safetensors"), "pt") as f:
        for saved in f.keys():
            name, w = release_name(saved), f.get_tensor(saved)
            if ".ffn.experts." in name:
                release[name], release[name[:-len("weight")] + "scale"] = quantize_fp4(w)
                low_precision.append(name)
            elif name.endswith(FP8):
                release[name], release[name[:-len("weight")] + "scale"] = quantize_fp8(w)
                low_precision.append(name)
            elif name.endswith(BF16):
                release[name] = w.to(torch.bfloat16)
                low_precision.append(name)
            else:
                release[name] = w
    save_file({k: v.contiguous() for k, v in release.items()}, os.path.join(out, "model.safetensors"))
    with open(os.path.join(SOURCE, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [128, 128], "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    shutil.copy(os.path.join(SOURCE, "generation_config.json"), out)

    # transformers reads the release folder on the CPU by dequantizing every FP8 / FP4 weight.
    loaded = DeepseekV4ForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    original = DeepseekV4ForCausalLM.from_pretrained(SOURCE, dtype=torch.float32).state_dict()
    assert loaded.keys() == original.keys()
    # The answer: every tensor whose value the low-precision storage changed (all of the FP8, FP4
    # and bf16 ones); the others read back as the original model's.
    expected = {}
    for name, t in loaded.items():
        if t.dtype not in (torch.float32, torch.int64):
            raise SystemExit(f"{name} loaded as {t.dtype}: transformers did not dequantize it to f32")
        if not torch.equal(t, original[name]):
            expected[name] = t.contiguous()
    save_file(expected, os.path.join(out, "expected.safetensors"))
    print(f"{len(release)} release tensors ({len(low_precision)} in fp8 / fp4 / bf16); "
          f"{len(expected)} of transformers' {len(loaded)} changed by that storage")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/deepseek_v4_release")
