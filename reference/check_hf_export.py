"""Loads a `titan ckpt convert --to-hf` folder with transformers and checks it against a golden file:
the folder must load into DeepseekV3ForCausalLM with no missing, mismatched or unexpected key (the
MTP layers model.layers.<num_hidden_layers + K>.*, which transformers does not model, excepted when
config.json's num_nextn_predict_layers counts them), and its float64 logits on the golden tokens must
match the golden logits; when the golden has an MTP loss (deepseek_v3_saved.py's _mtp fixture) the
folder's MTP layer must reproduce it too (DeepSeek-V3's MTP, mtp_forward in deepseek_v3_saved.py).

    build/titan ckpt convert --from-hf tests/fixtures/deepseek_v3_tiny_saved --to /tmp/rt/ckpt
    build/titan ckpt convert --from /tmp/rt/ckpt/step-0 --to-hf /tmp/rt/hf --dtype f32
    reference/.venv/bin/python reference/check_hf_export.py /tmp/rt/hf tests/fixtures/deepseek_v3_tiny_saved/golden.safetensors

(the same with deepseek_v3_tiny_saved_mtp for the folder with an MTP layer). Exits 1 on a mismatch.
bf16 exports (--dtype bf16, the default) round the weights: pass --tol 0.1 (the fixtures then differ by ~0.05).
"""
import argparse
import json
import pathlib
import re
import sys

import torch
from safetensors.torch import load_file
from transformers import DeepseekV3ForCausalLM

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from deepseek_v3_saved import load_mtp, mtp_forward  # noqa: E402


def folder_weights(d):
    index = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(load_file(str(d / f)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=pathlib.Path)
    ap.add_argument("golden", type=pathlib.Path)
    ap.add_argument("--tol", type=float, default=1e-5, help="max |logit difference| allowed (f32 export: 1e-5)")
    args = ap.parse_args()
    config = json.loads((args.folder / "config.json").read_text())
    model, info = DeepseekV3ForCausalLM.from_pretrained(args.folder, dtype=torch.float64, attn_implementation="eager",
                                                        experts_implementation="eager", output_loading_info=True)
    model.eval()
    n, mtp_layers = config["num_hidden_layers"], config.get("num_nextn_predict_layers", 0)
    mtp_key = re.compile(r"model\.layers\.(\d+)\.")
    ok = True

    def is_mtp(k):
        m = mtp_key.match(k)
        return m is not None and n <= int(m.group(1)) < n + mtp_layers

    unexpected = sorted(k for k in info["unexpected_keys"] if not is_mtp(k))
    for what, keys in (("missing", sorted(info["missing_keys"])), ("unexpected", unexpected),
                       ("mismatched", sorted(map(str, info["mismatched_keys"]))), ("error", info["error_msgs"])):
        if keys:
            ok = False
            print(f"FAIL {what} keys: {keys}")
    weights = folder_weights(args.folder)
    in_folder = sorted({int(mtp_key.match(k).group(1)) for k in weights if mtp_key.match(k)
                        and int(mtp_key.match(k).group(1)) >= n})
    print(f"loaded {args.folder}: num_nextn_predict_layers {mtp_layers}, MTP layers in the folder {in_folder}, "
          f"{len(info['unexpected_keys'])} keys transformers skips (MTP)")
    if in_folder != list(range(n, n + len(in_folder))) or len(in_folder) != mtp_layers:
        ok = False
        print(f"FAIL config.json's num_nextn_predict_layers {mtp_layers} does not count the MTP layers {in_folder}")

    golden = load_file(str(args.golden))
    tokens, targets = golden["tokens"].long(), golden["targets"].long()
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.reshape(-1, config["vocab_size"])
        diff = (logits - golden["logits"].double()).abs().max().item()
        print(f"logits vs golden: max |diff| {diff:.3e} (tol {args.tol:g})")
        ok &= diff <= args.tol
        if "mtp_loss" in golden:
            if not in_folder:
                ok = False
                print("FAIL the golden has an MTP loss but the folder has no MTP layer")
            else:
                mtp_logits, mtp_loss = mtp_forward(model, *load_mtp(model, weights, torch.float64), tokens, targets)
                d_logits = (mtp_logits - golden["mtp_logits"].double()).abs().max().item()
                d_loss = abs(mtp_loss.item() - golden["mtp_loss"].item())
                print(f"MTP logits vs golden: max |diff| {d_logits:.3e}; MTP loss {mtp_loss.item():.6f} "
                      f"(golden {golden['mtp_loss'].item():.6f})")
                ok &= d_logits <= args.tol and d_loss <= args.tol
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
