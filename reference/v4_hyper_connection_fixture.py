"""Golden fixture for titan's mHC modules (src/titan/models/deepseek_v4/hyper_connection.h):
transformers' DeepseekV4HyperConnection and DeepseekV4HyperHead on random f32 streams, with
random (non-initial) parameters, a decoder layer's merge X'_k = post_k a + sum_j comb[j, k] X_j
exactly as DeepseekV4DecoderLayer writes it, and the gradients of a fixed probe loss.

    python reference/v4_hyper_connection_fixture.py tests/fixtures/v4_hyper_connection.safetensors
"""
import sys

import torch
from safetensors.torch import save_file
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HyperConnection, DeepseekV4HyperHead

TOKENS, STREAMS, DIM, ITERS = 5, 4, 12, 20


def main(out):
    torch.manual_seed(0)
    config = DeepseekV4Config(hidden_size=DIM, hc_mult=STREAMS, hc_sinkhorn_iters=ITERS, hc_eps=1e-6, rms_norm_eps=1e-6)
    hc = DeepseekV4HyperConnection(config).float()
    head = DeepseekV4HyperHead(config).float()
    with torch.no_grad():
        for p in (hc.fn, head.hc_fn):
            p.copy_(torch.randn_like(p) * 0.3)
        for p in (hc.base, head.hc_base):
            p.copy_(torch.randn_like(p) * 0.5)
        hc.scale.copy_(torch.tensor([0.7, 1.3, 0.9]))
        head.hc_scale.copy_(torch.tensor([1.1]))
    streams = torch.randn(1, TOKENS, STREAMS, DIM, requires_grad=True)
    block_out = torch.randn(1, TOKENS, DIM, requires_grad=True)

    post, comb, collapsed = hc(streams)
    merged = post.unsqueeze(-1) * block_out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), streams)
    y = head(streams)
    probe_merged = torch.randn_like(merged)
    probe_collapsed = torch.randn_like(collapsed)
    probe_head = torch.randn_like(y)
    loss = (merged * probe_merged).sum() + (collapsed * probe_collapsed).sum() + (y * probe_head).sum()
    loss.backward()

    t = {
        "streams": streams.detach()[0], "block_out": block_out.detach()[0],
        "hc.fn": hc.fn.detach(), "hc.base": hc.base.detach(), "hc.scale": hc.scale.detach(),
        "head.fn": head.hc_fn.detach(), "head.base": head.hc_base.detach(), "head.scale": head.hc_scale.detach(),
        "probe_merged": probe_merged[0], "probe_collapsed": probe_collapsed[0], "probe_head": probe_head[0],
        "out.post": post.detach()[0], "out.comb": comb.detach()[0], "out.collapsed": collapsed.detach()[0],
        "out.merged": merged.detach()[0], "out.head": y.detach()[0],
        "grad.streams": streams.grad[0], "grad.block_out": block_out.grad[0],
        "grad.hc.fn": hc.fn.grad, "grad.hc.base": hc.base.grad, "grad.hc.scale": hc.scale.grad,
        "grad.head.fn": head.hc_fn.grad, "grad.head.base": head.hc_base.grad, "grad.head.scale": head.hc_scale.grad,
    }
    save_file({k: v.contiguous().float() for k, v in t.items()}, out)


if __name__ == "__main__":
    main(sys.argv[1])
