"""Golden fixture for titan's DeepSeek-V4 (src/titan/models/deepseek_v4/): transformers'
DeepseekV4ForCausalLM on the tiny config of ../shared/reference/v4_transformers.md section 10 at half its widths (every
layer type, both routings, YaRN on the compressed layers), f32, eager attention.

Zero / one initial values hide bugs, so the sinks, position biases, mHC bases and scales, the
routers' correction bias and the hash table are randomised (section 10.1). The indexer's top-k
must have no ties at its boundary (10.2): the script re-seeds until none. Saved, besides the
config (tests/fixtures/deepseek_v4_tiny/config.json):
  model.safetensors: the model as save_pretrained writes it (DeepSeek's naming);
  golden.safetensors: input_ids, logits, loss, every parameter's gradient (grad.<name>), and per
    layer l the attention's input and output and their gradients (attn.<l>.in, .out, .din, .dout),
    a CSA layer's indexer selection (attn.<l>.topk, -1 padded), and greedy_ids: PROMPT (tokenized
    by TOKENIZER) and its greedy continuation of NEW_TOKENS tokens by full forwards.

    python reference/deepseek_v4_fixture.py tests/fixtures/deepseek_v4_tiny
"""
import os
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as v4

BATCH, SEQ = 2, 37
TOKENIZER = "tests/fixtures/tokenizer/gpt2_bpe.json"
PROMPT, NEW_TOKENS = "the cat sat on the", 6


def build_config(**changes):
    # Section 10's schedule and features at half its widths, to keep the fixture small; the
    # vocabulary of tests/fixtures/tokenizer/gpt2_bpe.json, so that text can be generated from it.
    # S = 37 gives CSA 9 entries (> index_topk, a 1-token tail) and HCA 4 (a 5-token tail), S > W.
    # changes: keys that replace these (another fixture's variant).
    return DeepseekV4Config(**{**dict(
        vocab_size=1000, hidden_size=32, num_hidden_layers=5, num_attention_heads=2, head_dim=32,
        partial_rotary_factor=0.25, q_lora_rank=16, o_groups=2, o_lora_rank=8,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention", "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, sliding_window=8,
        index_n_heads=4, index_head_dim=16, index_topk=4, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, swiglu_limit=0.1, hc_mult=4, hc_sinkhorn_iters=20, max_position_embeddings=64,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                         "beta_fast": 32, "beta_slow": 1},
        attn_implementation="eager"), **changes})


def randomise(model, config, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks") or name.endswith("position_bias") or name.endswith(".base") or name.endswith("hc_base"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith(".scale") or name.endswith("hc_scale"):
                p.copy_(1 + torch.randn(p.shape, generator=gen) * 0.3)
            elif p.dim() == 1:  # norm weights
                p.copy_(1 + torch.randn(p.shape, generator=gen) * 0.1)
            elif ".indexer." in name:  # index scores of order one, so that the top-k has clear gaps
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.05)
            elif name.endswith("tid2eid"):
                k = b.shape[1]
                rows = [torch.randperm(config.n_routed_experts, generator=gen)[:k] for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows))


def main(out):
    config = build_config()
    for seed in range(100):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = DeepseekV4ForCausalLM(config).float()
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
        randomise(model, config, gen)
        input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=gen)

        captured, grads, ties = {}, {}, []

        def keep(prefix):
            def hook(module, args, kwargs, output):
                if not torch.is_grad_enabled():  # the greedy decode at the end
                    return
                x = args[0] if args else kwargs["hidden_states"]
                y = output[0] if isinstance(output, tuple) else output
                x.retain_grad()
                y.retain_grad()
                captured[prefix] = (x, y)
            return hook

        def keep_scores(layer):
            def hook(module, args, output):
                if not torch.is_grad_enabled():
                    return
                scores = output.detach()  # [B, S, T], before the causal mask
                t = scores.shape[-1]
                m = config.compress_rates["compressed_sparse_attention"]
                for s in range(SEQ):
                    valid = (s + 1) // m
                    if valid > config.index_topk:
                        row = scores[:, s, :valid].sort(dim=-1, descending=True).values
                        gap = (row[:, config.index_topk - 1] - row[:, config.index_topk]).abs().min().item()
                        if gap < 1e-4 * max(row.abs().max().item(), 1e-30):
                            ties.append((layer, s, gap))
            return hook

        def keep_topk(layer):
            def hook(module, args, output):
                if torch.is_grad_enabled():
                    captured[f"attn.{layer}.topk"] = output
            return hook

        for l, layer in enumerate(model.model.layers):
            layer.self_attn.register_forward_hook(keep(f"attn.{l}"), with_kwargs=True)
            comp = layer.self_attn.compressor
            if comp is not None and hasattr(comp, "indexer"):
                comp.indexer.scorer.register_forward_hook(keep_scores(l))
                comp.indexer.register_forward_hook(keep_topk(l))
        result = model(input_ids=input_ids, labels=input_ids, use_cache=False)
        if ties:
            print(f"seed {seed}: {len(ties)} indexer ties, re-seeding")
            continue
        result.loss.backward()
        break
    else:
        raise SystemExit("no seed without indexer ties")

    golden = {"input_ids": input_ids.to(torch.int32), "logits": result.logits.detach()[..., :],
              "loss": result.loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        golden["grad." + name] = p.grad if p.grad is not None else torch.zeros_like(p)
    for prefix, value in captured.items():
        if prefix.endswith(".topk"):
            golden[prefix] = value.to(torch.int32)
            continue
        x, y = value
        golden[prefix + ".in"], golden[prefix + ".out"] = x.detach(), y.detach()
        golden[prefix + ".din"], golden[prefix + ".dout"] = x.grad, y.grad
    # Greedy continuation of a prompt, as `titan generate --temperature 0` must print it.
    # titan generate puts the tokenizer's BOS first (<|bos|> in this one); so does this prompt.
    tok = Tokenizer.from_file(TOKENIZER)
    prompt = [tok.token_to_id("<|bos|>")] + tok.encode(PROMPT).ids
    with torch.no_grad():
        ids = torch.tensor([prompt])
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=ids, use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    golden["greedy_ids"] = ids[0].to(torch.int32)
    os.makedirs(out, exist_ok=True)
    # The folder as transformers' save_pretrained writes it (DeepSeek's naming: attn.wq_a,
    # ffn.experts.E.w1, hc_attn_fn, head.weight, ...), which `titan ckpt convert --from-hf` reads.
    model.save_pretrained(out)
    save_file({k: v.contiguous().float() if v.dtype != torch.int32 else v.contiguous() for k, v in golden.items()},
              os.path.join(out, "golden.safetensors"))
    print(f"seed {seed}: loss {result.loss.item():.6f}")


if __name__ == "__main__":
    main(sys.argv[1])
