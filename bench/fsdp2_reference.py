"""PyTorch's own FSDP2 (torch.distributed.fsdp.fully_shard) over Gloo, training the Llama 3 model
of bench/torch_reference.py, for side-by-side step times with titan's FSDP: same flavor, sequence
length, per-rank batch, float32, AdamW and gradient clipping, one rank per process under
torchrun. bench/latency_bench.sh runs it across the two-host bed at several added delays. titan
itself has no Python; this file only measures.

Sharding as TorchTitan's apply_fsdp: the token embedding, each transformer block, and the final
norm with the output head (not resharded after forward) are units, the root holds the rest.

It prints rank 0's median step time (each step ends with the loss read, as titan's logged
steps) and counts the collectives of one step: every Gloo operation the profiler
sees ("gloo:all_gather", "gloo:reduce_scatter", ...), by kind, on rank 0.

    torchrun --nproc_per_node 4 bench/fsdp2_reference.py --flavor debugmodel_narrow \
        --seq 64 --batch 2 --steps 10

--op-latency times single Gloo ops instead (rank 0's mean over 10, after a barrier): the
all-reduce of one value (the loss, the gradient norm), an all-to-all of 4 values and of one
block's worth (titan's all-gather and reduce-scatter are all-to-alls on Gloo), PyTorch's
all-gather of a block, and two ops in flight at once; across a link with latency, each op's time
in round trips.
"""
import argparse
import collections
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import FLAVORS, Transformer, emit  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flavor", default="debugmodel_narrow", choices=sorted(FLAVORS))
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per rank")
    p.add_argument("--op-latency", action="store_true",
                   help="time single Gloo ops instead of training")
    p.add_argument("--json", help="rank 0 also writes its result to this file")
    return p.parse_args()


def gloo_ops_of_one_step(step):
    """Runs step() under the profiler; returns {op kind: count} of the Gloo work it issued."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    counts = collections.Counter()
    for event in prof.events():
        if event.name.startswith("gloo:"):
            counts[event.name[len("gloo:"):]] += 1
    return dict(counts)


def op_latency(a, world):
    """{op: ms}, rank 0's mean over 10 runs of each op."""
    block = 53312  # one debugmodel_narrow block's elements per rank
    one, four = torch.ones(1), torch.ones(world)
    four_out = torch.empty(world)
    x = torch.ones(world * block)
    y = torch.empty_like(x)
    gathered = torch.empty(world * block)
    shard = torch.ones(block)

    def two_in_flight():
        works = [dist.all_to_all_single(y, x, async_op=True), dist.all_reduce(one, async_op=True)]
        for w in works:
            w.wait()

    ops = {"all_reduce 1 value": lambda: dist.all_reduce(one),
           f"all_to_all {world} values": lambda: dist.all_to_all_single(four_out, four),
           f"all_to_all {world} x {block}": lambda: dist.all_to_all_single(y, x),
           f"all_gather_into_tensor {block}": lambda: dist.all_gather_into_tensor(gathered, shard),
           "all_to_all + all_reduce in flight": two_in_flight}
    out = {}
    for name, fn in ops.items():
        fn()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(10):
            fn()
        out[name] = round((time.perf_counter() - t0) / 10 * 1000, 2)
    return out


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.op_latency:
        result = {"world": world, "torch": torch.__version__, "op_ms": op_latency(a, world)}
        if rank == 0:
            emit(result, a.json)
        dist.barrier()  # nobody leaves while a peer still reads
        dist.destroy_process_group()
        return 0
    dims = FLAVORS[a.flavor]
    torch.manual_seed(0)
    model = Transformer(dims, a.seq, torch.float32)
    model.init_weights()
    fully_shard(model.tok_embeddings)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard([model.norm, model.output], reshard_after_forward=False)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=True)
    generator = torch.Generator().manual_seed(1000 + rank)

    def step():
        tokens = torch.randint(dims[4], (a.batch, a.seq + 1), generator=generator)
        opt.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        # The logged loss is the data-parallel mean, as titan's.
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        return mean.item() / world

    for _ in range(a.warmup):
        step()
    ops = gloo_ops_of_one_step(step)
    dist.barrier()
    losses, times = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    if rank == 0:
        emit({"flavor": a.flavor, "seq": a.seq, "batch_per_rank": a.batch, "world": world,
              "torch": torch.__version__, "steps": a.steps,
              "step_s": statistics.median(times), "step_times_s": times,
              "gloo_ops_per_step": ops, "gloo_ops_total": sum(ops.values()),
              "losses": losses}, a.json)
    dist.barrier()  # nobody leaves while a peer still reads
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
