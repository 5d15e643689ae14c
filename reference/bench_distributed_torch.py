"""PyTorch side of the "Distributed training" comparison: the Llama-3 debugmodel shape (dim 256,
6 layers, 16 heads, FFN 768, vocab 2048 = our KJV tokenizer's) trained with torch.distributed on
the gloo backend by 2 processes on the same CPU cores, as DDP and as FSDP2 (`fully_shard` on the
embedding, on every block, on norm + output together and on the root, as TorchTitan shards
Llama-3), with AdamW and global-norm clipping on next-token cross-entropy of random tokens.

Each process gets 1 intra-op and 1 inter-op thread and is pinned to its own core (rank r on core
r). A few warm-up steps, then `--steps` timed steps between barriers; global tokens/s is
world x local_batch x seq x steps / the slowest rank's wall time for them.

Memory, per rank (two figures, from two separate launches so that neither disturbs the other):
  peak_rss_bytes        VmHWM of the process in the timed launch: everything resident (Python,
                        libtorch, gloo's buffers and threads, the model's tensors). rss_growth_bytes
                        subtracts VmRSS after `import torch` and init_process_group, before the model.
  peak_tensor_bytes     the largest number of bytes held by live CPU tensors during one steady-state
                        training step (zero_grad .. optimizer.step, after the warm-up): the storages
                        Python reaches when the step starts (parameters, gradients, optimizer state,
                        buffers, DDP's buckets through the gradients that view them, FSDP's shards),
                        plus every allocation and free torch.profiler (profile_memory=True) records
                        during the step, frees paired with allocations by pointer. The analogue of
                        titan's allocator peak (metrics.jsonl "peak_memory_bytes"."total": live
                        tensor bytes, its cache excluded). gloo's worker threads are invisible to the
                        profiler and free a few of FSDP's buffers: such blocks (phantom_bytes) are
                        left out of peak_tensor_bytes, kept to the end in peak_tensor_bytes_upper;
                        blocks alive at the start that Python cannot reach are missed. Both errors
                        make torch's figure lower, never higher.

    reference/.venv/bin/python reference/bench_distributed_torch.py --mode fsdp --dtype float32
    reference/.venv/bin/python reference/bench_distributed_torch.py --mode ddp --dtype bfloat16 --steps 10

prints one JSON line. AdamW (lr 8e-4, betas 0.9/0.95, weight decay 0.1 but not on norms, as
configs/llama3_debug.toml) is torch's foreach implementation by default (--adamw), as are the
gradient norm and clipping (get_total_norm, then full_tensor() under FSDP, as TorchTitan). bf16: DDP runs the step under torch.autocast(bfloat16) (f32 parameters and
gradients); FSDP2 uses MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) as
TorchTitan does (bf16 all-gathers and compute, f32 reduce-scatter and f32 sharded master weights).

`compare` mode (the driver, see compare()) runs titan and this script on the same settings, one
after the other, and prints the ratios:

    reference/.venv/bin/python reference/bench_distributed_torch.py compare --titan build/titan \
        --dtypes float32,bfloat16 --repeats 1
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def vm_status(field):  # bytes, from /proc/self/status
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return -1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(a, torch):
    sys.path.insert(0, str(HERE))
    from bench_llama3_torch import Llama  # the same modules bench_train_step compares against
    from llama3 import inv_freq  # Llama 3.1 RoPE frequency scaling, as titan's debugmodel uses

    torch.manual_seed(0)
    shape = argparse.Namespace(dim=a.dim, layers=a.layers, heads=a.heads, kv_heads=0, vocab=a.vocab, seq=a.seq)
    model = Llama(shape)
    freqs = inv_freq(dict(dim=a.dim, n_heads=a.heads, rope_theta=500000.0, rope_llama3_scaling=True)).float()
    ang = torch.arange(a.seq).float()[:, None] * freqs[None, :]
    dt = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32  # bf16 q, k stay bf16 through RoPE
    model.cos = torch.cat([ang.cos(), ang.cos()], -1).to(dt)
    model.sin = torch.cat([ang.sin(), ang.sin()], -1).to(dt)
    return model


def tensor_storages(torch):
    """{data pointer: bytes} of every CPU tensor storage Python can reach (parameters, gradients,
    optimizer state, buffers; a DTensor's local shard), and their sum."""
    import gc
    import warnings
    seen = {}
    with warnings.catch_warnings():  # isinstance on deprecated torch.distributed names warns
        warnings.simplefilter("ignore")
        objs = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for o in objs:
        t = getattr(o, "_local_tensor", o)  # DTensor: the shard it holds
        try:
            st = t.untyped_storage()
        except Exception:
            continue
        if st.device.type == "cpu" and st.nbytes() > 0:
            seen[st.data_ptr()] = st.nbytes()
    return seen, sum(seen.values())


def measure_step_tensors(torch, step):
    """Peak bytes of live CPU tensors during step(): those alive when it starts (found by
    tensor_storages) plus the allocations and frees torch.profiler records during it. The profiler
    sees only the threads it runs on; gloo's worker threads drop the last reference to a few
    buffers, so some frees go unseen: a block allocated in the step and never seen freed, even
    through a second step, is a phantom. peak_tensor_bytes leaves phantoms out (the lower bound,
    as if freed at once); peak_tensor_bytes_upper keeps them to the end."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch._C._profiler import _EventType
    base, base_total = tensor_storages(torch)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("bench_measured_step"):
            step()
        step()  # the tail: what the measured step leaves for the next one is freed here
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    mark = None
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size))
        elif e.name == "bench_measured_step":
            mark = (e.start_time_ns, e.end_time_ns)
    events.sort()
    # Pair every allocation with its free (by pointer, in time order).
    live_ptr, allocs = dict(base), []  # allocs: [t_alloc, size, t_free or None]
    open_alloc = {}
    for t, ptr, n in events:
        if n > 0:
            if ptr in open_alloc:  # the pointer came back: its earlier block was freed unseen
                open_alloc.pop(ptr)
            open_alloc[ptr] = len(allocs)
            allocs.append([t, n, None])
        elif ptr in open_alloc:
            allocs[open_alloc.pop(ptr)][2] = t
        elif ptr in live_ptr:  # a block that was alive at the start
            allocs.append([None, live_ptr.pop(ptr), t])
    s0, s1 = mark
    timeline = []
    phantom = 0
    for t_alloc, n, t_free in allocs:
        if t_alloc is not None and t_alloc > s1:
            continue
        if t_alloc is None:  # alive at the start, freed at t_free
            if t_free <= s1:
                timeline.append((t_free, -n, False))
            continue
        ghost = t_free is None
        phantom += n if ghost else 0
        timeline.append((t_alloc, n, ghost))
        if not ghost and t_free <= s1:
            timeline.append((t_free, -n, False))
    timeline.sort()
    live = upper = base_total
    peak = peak_upper = base_total
    for t, n, ghost in timeline:
        upper += n
        live += 0 if ghost else n
        peak, peak_upper = max(peak, live), max(peak_upper, upper)
    return {"peak_tensor_bytes": peak, "peak_tensor_bytes_upper": peak_upper, "live_tensors_at_start": base_total,
            "phantom_bytes": phantom}



def worker(rank, a, port, phase, results):
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.world)
    rss0 = vm_status("VmRSS")
    model = build_model(a, torch)
    bf16 = a.dtype == "bfloat16"
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        # Gradients as views of the all-reduce buckets (no second copy), as titan's DDP does.
        model = DDP(model, gradient_as_bucket_view=True)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh("cpu", (a.world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
        # TorchTitan's apply_fsdp: the embedding, each block (resharded after forward), norm and
        # output together (kept gathered: their backward follows at once), then the root.
        fully_shard(model.tok_embeddings, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
        fully_shard([model.norm, model.output], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        fully_shard(model, mesh=mesh, mp_policy=mp)
    params = list(model.parameters())
    decay = [p for n, p in model.named_parameters() if not n.endswith("norm.weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=8e-4, betas=(0.9, 0.95), eps=1e-8, **{a.adamw: True} if a.adamw != "forloop" else {})
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own batch
    batches = [torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g) for _ in range(4)]

    def step(i):
        tokens = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and a.mode == "ddp"):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0, foreach=a.adamw != "forloop")
        if hasattr(norm, "full_tensor"):  # FSDP: a partial DTensor, summed over the shards
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm, foreach=a.adamw != "forloop")
        opt.step()
        return loss.item()

    out = {"rank": rank}
    if phase == "time":
        for i in range(a.warmup):
            step(i)
        times = []
        dist.barrier()
        t_start = time.perf_counter()
        for i in range(a.steps):
            t0 = time.perf_counter()
            loss = step(a.warmup + i)
            times.append(time.perf_counter() - t0)
        dist.barrier()
        out.update(seconds=time.perf_counter() - t_start, step_times=times, loss=loss,
                   peak_rss_bytes=vm_status("VmHWM"), rss_after_init_bytes=rss0)
    else:
        for i in range(a.warmup):
            step(i)
        out.update(measure_step_tensors(torch, lambda: step(a.warmup)))
    results.put(out)
    dist.barrier()
    dist.destroy_process_group()


def launch(a, phase):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(worker, args=(a, free_port(), phase, results), nprocs=a.world, join=True)
    out = [results.get() for _ in range(a.world)]
    return sorted(out, key=lambda r: r["rank"])


def bench(a):
    import torch
    rec = {"side": "torch", "mode": a.mode, "dtype": a.dtype, "world": a.world, "local_batch": a.batch, "seq": a.seq,
           "steps": a.steps, "warmup": a.warmup, "torch": torch.__version__, "backend": "gloo", "adamw": a.adamw}
    if a.measure in ("time", "both"):
        ranks = launch(a, "time")
        seconds = max(r["seconds"] for r in ranks)
        step_times = [max(t) for t in zip(*(r["step_times"] for r in ranks))]
        tokens = a.world * a.batch * a.seq
        rec.update(tokens_per_second=tokens * a.steps / seconds, best_step_tokens_per_second=tokens / min(step_times),
                   step_seconds=seconds / a.steps, loss=ranks[0]["loss"],
                   peak_rss_bytes=[r["peak_rss_bytes"] for r in ranks],
                   rss_after_init_bytes=[r["rss_after_init_bytes"] for r in ranks],
                   rss_growth_bytes=[r["peak_rss_bytes"] - r["rss_after_init_bytes"] for r in ranks])
    if a.measure in ("tensors", "both"):
        ranks = launch(a, "tensors")
        for k in ("peak_tensor_bytes", "peak_tensor_bytes_upper", "live_tensors_at_start", "phantom_bytes"):
            rec[k] = [r[k] for r in ranks]
    print(json.dumps(rec), flush=True)
    return rec


# ---------------------------------------------------------------------------------------------
# Driver: titan vs this script, same model, batch, steps, ranks and cores, one run at a time.

def run_titan(a, mode, dtype):
    dp = ["--parallelism.data_parallel_shard_degree=2"] if mode == "fsdp" else \
        ["--parallelism.data_parallel_replicate_degree=2", "--parallelism.data_parallel_shard_degree=1"]
    with tempfile.TemporaryDirectory(prefix="titan_dist_bench_") as d:
        env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        # Each rank under /usr/bin/time, which records its peak RSS (ru_maxrss of the child).
        wrap = ["sh", "-c", 'exec /usr/bin/time -f %M -o "$0/maxrss.$OMPI_COMM_WORLD_RANK" "$@"', d]
        cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "core", "--map-by", "core", *wrap,
               str(Path(a.titan).resolve()), "train", "--config", str(ROOT / "configs/llama3_debug.toml"), *dp,
               f"--training.steps={a.warmup + a.steps}", f"--training.local_batch_size={a.batch}",
               f"--training.seq_len={a.seq}", "--training.dtype=float32",
               f"--training.mixed_precision_param={dtype}", "--metrics.log_freq=1", f"--job.dump_folder={d}",
               "--checkpoint.enable=false", "--validation.enable=false", "--activation_checkpoint.mode=none"]
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"titan failed ({p.returncode}):\n{' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        steps = [json.loads(l) for l in open(Path(d) / "metrics.jsonl")]
        steps = [s for s in steps if s.get("kind") == "train" and s["step"] > a.warmup]
        assert len(steps) == a.steps, f"expected {a.steps} timed steps, got {len(steps)}"
        tokens = 2 * a.batch * a.seq
        seconds = sum(tokens / s["tokens_per_second"] for s in steps)  # the windows' lengths
        rss = [int(open(Path(d) / f"maxrss.{r}").read().split()[-1]) * 1024 for r in range(2)]
        return {"side": "titan", "mode": mode, "dtype": dtype, "tokens_per_second": tokens * a.steps / seconds,
                "best_step_tokens_per_second": max(s["tokens_per_second"] for s in steps),
                "peak_tensor_bytes": max(s["peak_memory_bytes"]["total"] for s in steps),  # max over ranks already
                "peak_rss_bytes": rss, "loss": steps[-1]["loss"], "cmd": " ".join(cmd).replace(d, "DIR")}


def compare(a):
    mib = lambda b: b / 2**20
    rows = []
    print(f"load average before: {os.getloadavg()}", flush=True)
    for rep in range(a.repeats):
        for dtype in a.dtypes.split(","):
            for mode in ("ddp", "fsdp"):
                la = os.getloadavg()[0]
                ours = run_titan(a, mode, dtype)
                print(json.dumps(ours), flush=True)
                b = argparse.Namespace(**{**vars(a), "mode": mode, "dtype": dtype, "measure": "both"})
                theirs = bench(b)
                rows.append((rep, mode, dtype, la, ours, theirs))
    print(f"load average after: {os.getloadavg()}")
    print(f"\nLlama-3 debugmodel, 2 ranks x 1 core, local batch {a.batch} x seq {a.seq}, "
          f"{a.steps} timed steps after {a.warmup}; tokens/s global; memory per rank (max of the 2 ranks), MiB")
    hdr = ("run", "mode", "dtype", "load1", "tok/s ours", "tok/s torch", "ratio",
           "tensors ours", "tensors torch", "ratio", "RSS ours", "RSS torch", "ratio", "torch RSS growth")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for rep, mode, dtype, la, o, t in rows:
        rss_o, rss_t = max(o["peak_rss_bytes"]), max(t["peak_rss_bytes"])
        ten_t = max(t["peak_tensor_bytes"])
        cells = [rep + 1, mode.upper(), dtype, f"{la:.2f}", f"{o['tokens_per_second']:.0f}", f"{t['tokens_per_second']:.0f}",
                 f"{o['tokens_per_second'] / t['tokens_per_second']:.2f}x", f"{mib(o['peak_tensor_bytes']):.1f}",
                 f"{mib(ten_t):.1f}", f"{o['peak_tensor_bytes'] / ten_t:.2f}", f"{mib(rss_o):.0f}", f"{mib(rss_t):.0f}",
                 f"{rss_o / rss_t:.2f}", f"{mib(max(t['rss_growth_bytes'])):.0f}"]
        print("| " + " | ".join(map(str, cells)) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", nargs="?", default="bench", choices=["bench", "compare"])
    p.add_argument("--mode", default="fsdp", choices=["ddp", "fsdp"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--dtypes", default="float32,bfloat16", help="compare: the dtypes to run")
    p.add_argument("--repeats", type=int, default=1, help="compare: rounds of all the runs")
    p.add_argument("--titan", default=str(ROOT / "build/titan"), help="compare: the titan binary")
    p.add_argument("--measure", default="both", choices=["time", "tensors", "both"])
    p.add_argument("--adamw", default="foreach", choices=["fused", "foreach", "forloop"],
                   help="torch AdamW implementation (and foreach norm/clip unless forloop)")
    for k, v in dict(dim=256, layers=6, heads=16, vocab=2048, batch=8, seq=256, world=2, warmup=3, steps=10,
                     ).items():
        p.add_argument(f"--{k.replace('_', '-')}", type=int, default=v)
    a = p.parse_args()
    compare(a) if a.command == "compare" else bench(a)


if __name__ == "__main__":
    main()
