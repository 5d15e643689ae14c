"""Golden fixture for titan's Muon (src/titan/optim/muon.h): torch.optim.Muon, several steps on
awkward shapes, with its Newton-Schulz iteration run in f32 instead of bf16 (the only change; the
iteration is torch's own code otherwise) so that f32 results can be compared to 1e-6.

    python reference/muon_fixture.py tests/fixtures/muon_golden.safetensors
"""
import sys

import torch
import torch.optim._muon as muon_module
from safetensors.torch import save_file

SHAPES = [(7, 3), (3, 11), (1, 9), (16, 16), (40, 24)]  # tall, wide, 1 x n, square, larger
STEPS = 4
CONFIGS = [  # lr, weight_decay, momentum, nesterov, adjust_lr_fn
    (0.02, 0.1, 0.95, True, "original"),
    (0.01, 0.01, 0.9, False, "match_rms_adamw"),
]

_torch_ns = muon_module._zeropower_via_newtonschulz


def _f32_newton_schulz(grad, ns_coefficients, ns_steps, eps):
    """torch's iteration, line for line, without the cast to bf16."""
    a, b, c = ns_coefficients
    ortho_grad = grad.clone().float()
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    ortho_grad.div_(ortho_grad.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram_matrix = ortho_grad @ ortho_grad.T
        gram_update = torch.addmm(gram_matrix, gram_matrix, gram_matrix, beta=b, alpha=c)
        ortho_grad = torch.addmm(ortho_grad, gram_update, ortho_grad, beta=a)
    if grad.size(0) > grad.size(1):
        ortho_grad = ortho_grad.T
    return ortho_grad


def main(out):
    muon_module._zeropower_via_newtonschulz = _f32_newton_schulz
    torch.manual_seed(0)
    tensors = {}
    for c, (lr, wd, momentum, nesterov, adjust) in enumerate(CONFIGS):
        params = [torch.nn.Parameter(torch.randn(s, dtype=torch.float32)) for s in SHAPES]
        for i, p in enumerate(params):
            tensors[f"c{c}.p{i}.init"] = p.detach().clone()
        opt = torch.optim.Muon(params, lr=lr, weight_decay=wd, momentum=momentum, nesterov=nesterov,
                               adjust_lr_fn=adjust)
        for step in range(STEPS):
            for i, p in enumerate(params):
                p.grad = torch.randn(p.shape, dtype=torch.float32) * (0.1 if step % 2 else 1.0)
                tensors[f"c{c}.p{i}.grad{step}"] = p.grad.clone()
            opt.step()
            for i, p in enumerate(params):
                tensors[f"c{c}.p{i}.step{step}"] = p.detach().clone()
        for i, p in enumerate(params):
            tensors[f"c{c}.p{i}.buffer"] = opt.state[p]["momentum_buffer"].clone()
    # One Newton-Schulz call on its own, per shape.
    for i, s in enumerate(SHAPES):
        g = torch.randn(s, dtype=torch.float32)
        tensors[f"ns{i}.in"] = g
        tensors[f"ns{i}.out"] = _f32_newton_schulz(g, (3.4445, -4.775, 2.0315), 5, 1e-7)
    save_file({k: v.contiguous() for k, v in tensors.items()}, out)
    print(f"wrote {out}: {len(tensors)} tensors (torch {torch.__version__})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/muon_golden.safetensors")
