"""One timed PyTorch training loop shared by the whole-model comparison scripts
(bench_llama3_torch.py, bench_deepseek_v3_torch.py): AdamW step with global-norm clipping on
next-token cross-entropy, one warm-up step (compilation for torch.compile), then the best of
`steps` timed steps, printed as one JSON line that bench/bench_train_step.cpp parses."""
import json
import resource
import time

import torch
import torch.nn.functional as F


def time_training(model, forward, tokens, vocab, dtype, steps, rss0, **extra):
    """forward(inputs) -> logits; tokens [batch, seq + 1]; rss0: ru_maxrss (KiB) before the model."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            logits = forward(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    t0 = time.perf_counter()
    step()
    warm = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    best = min(times)
    print(json.dumps({**extra, "dtype": dtype, "tokens_per_second": tokens.shape[0] * (tokens.shape[1] - 1) / best,
                      "step_seconds": best, "warmup_seconds": warm, "threads": torch.get_num_threads(),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "rss_before_bytes": rss0 * 1024}))
