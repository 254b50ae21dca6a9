"""Past one process: data-parallel training, corpus encoding and exact search with torch.distributed.

`torchrun --nproc_per_node N script.py ...` starts N copies of a script (on several machines with
--nnodes) and tells each, through environment variables, who it is: RANK (0 .. WORLD_SIZE - 1 over
all machines), LOCAL_RANK (which GPU of its machine), WORLD_SIZE, and MASTER_ADDR / MASTER_PORT
where they meet. `init_from_env` joins them into one process group: gloo on CPUs, NCCL on GPUs.
A script started without torchrun is a world of one, and every function here then does nothing
beyond what one process does anyway.

Training (Goyal et al. 2017, "Accurate, Large Minibatch SGD", section 2; what PyTorch's
DistributedDataParallel does). Every rank builds the same global batch (same examples, seed and
order) and embeds only its contiguous slice of it (`shard_range`). The loss of the global batch
is a mean over its examples, so its gradient is the sum over ranks of each rank's share:
- losses of one example at a time (Siamese, triplet, softmax): rank r computes the mean loss
  of its n_r examples and weights it by n_r / n (`local_loss_weight`), which is its share of the
  global mean;
- the multiple-negatives ranking loss couples every anchor with every positive of the batch, so
  a rank's slice alone would see only n_r - 1 negatives per anchor instead of n - 1. Each rank
  gathers the embeddings of all ranks (`gather_with_grad`) and computes the loss of the whole
  global batch; the gather's backward hands each rank the gradient of its own rows only, so
  that rank's parameters receive exactly the part of the gradient that flows through them.
After backward, `sum_gradients` all-reduces each gradient (the explicit form of what DDP does in
buckets while backward runs), so every rank holds the global batch's gradient, clips it and
takes the same AdamW step: the model stays the same on every rank without ever being sent.

Encoding and search (the shard-and-merge pattern of exact nearest-neighbour search over a
partitioned corpus). Rank r encodes the contiguous rows `shard_range(N, r, world)` of the corpus
(`encode_shard`): no rank ever holds more than its shard's embeddings. It searches its shard
exactly with minisbert.search.search, turns the shard's row numbers into corpus row numbers by
adding the shard's start, and `gather_top_k` collects the (Q, k) lists on rank 0, which merges them
(`merge_shard_top_k`) with the search's own tie rule: better score first, equal scores by lower
corpus index. The true top-k of the corpus is made of every shard's top-k among its own rows, so
the merge returns exactly the ranking one process would.

Checked with 2 processes over gloo in tests/training/test_distributed.py: training losses equal those of
one process to 1e-5, and the top-k ids of sharded search equal one process's.
"""

import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ..porting.prompts import encode_as
from ..search.inputs import merge_top_k
from ..search.ways import search


def init_from_env(timeout_minutes: int = 30) -> bool:
    """Join the process group torchrun describes in the environment; False (and nothing done)
    when the script runs as a single process. NCCL where this rank has a GPU, gloo otherwise."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1 or dist.is_initialized():
        return dist.is_initialized()
    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise ValueError(f"WORLD_SIZE is {os.environ['WORLD_SIZE']} but {name} is not set: start "
                             "several processes with torchrun, which sets all of them")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend, timeout=timedelta(minutes=timeout_minutes))
    return True


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """Rank 0 alone evaluates, prints, logs, checkpoints and saves."""
    return rank() == 0


def device_for_rank(requested: str | None) -> str | None:
    """Each rank of a machine takes its own GPU (cuda:LOCAL_RANK) unless a device was named."""
    if requested is None and dist.is_initialized() and torch.cuda.is_available():
        return f"cuda:{local_rank()}"
    return requested


def shard_range(n: int, shard: int | None = None, shards: int | None = None) -> tuple[int, int]:
    """[start, stop) of the `shard`-th of `shards` contiguous, nearly equal parts of n rows: the
    first n % shards parts hold one row more. Defaults: this rank, all ranks."""
    shard = rank() if shard is None else shard
    shards = world_size() if shards is None else shards
    size, extra = divmod(n, shards)
    start = shard * size + min(shard, extra)
    return start, start + size + (shard < extra)


# ---------------------------------------------------------------------------------------------
# Training


def local_loss_weight(local_examples: int, global_examples: int) -> float:
    """A rank's mean loss over its slice, times this, is its share of the global batch's mean."""
    return local_examples / global_examples


class _GatherWithGrad(torch.autograd.Function):
    """Forward: the rows of every rank, in rank order. Backward: the gradient of this rank's rows.

    Every rank computes the same loss from the same gathered tensor, so the gradient with respect to
    this rank's rows is already complete in its own copy: no communication is needed backward.
    (torch.distributed.nn.all_gather instead sums the gradients of all ranks, which is right when
    each rank computes a different part of the loss.)"""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, sizes: list) -> torch.Tensor:
        ctx.start = sum(sizes[:rank()])
        ctx.stop = ctx.start + rows.shape[0]
        # all_gather needs equal sizes: pad each slice to the largest, then cut the padding away.
        padded = rows.new_zeros((max(sizes), *rows.shape[1:]))  # (max n_r, D)
        padded[:rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])  # (n, D)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[ctx.start:ctx.stop], None


def gather_with_grad(rows: torch.Tensor, global_examples: int) -> torch.Tensor:
    """(n_r, D) rows of this rank's slice -> (n, D) rows of the whole global batch, gradients kept.
    Slices are shard_range's, so the result is in the global batch's order."""
    if world_size() == 1:
        return rows
    sizes = [stop - start for start, stop in (shard_range(global_examples, r) for r in range(world_size()))]
    return _GatherWithGrad.apply(rows, sizes)


def sum_tensor(value: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of a tensor (e.g. the weighted local losses, giving the global loss)."""
    if world_size() > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value


def sum_gradients(parameters: list) -> None:
    """Replace each parameter's gradient by its sum over ranks. Every rank runs the same model on
    the same kind of batch, so a parameter has a gradient on every rank or on none."""
    if world_size() == 1:
        return
    for parameter in parameters:
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad)


def barrier() -> None:
    """Wait until every rank gets here."""
    if world_size() > 1:
        dist.barrier()


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank, so that all start from the same model
    (a freshly drawn Dense layer is seeded alike everywhere, but this makes sure of it)."""
    if world_size() == 1:
        return
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=0)


def any_rank(flag: bool) -> bool:
    """True if `flag` is True on any rank: Ctrl-C reaches the ranks at slightly different moments,
    and all must stop after the same step, or the others would wait forever for the next one."""
    if world_size() == 1:
        return flag
    value = torch.tensor([int(flag)], device=_communication_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def gather_objects(value) -> list:
    """[rank 0's value, rank 1's, ...]: every rank's `value` (any picklable object), on every rank.
    Each rank's random generator state goes into the checkpoint this way, so that a resumed run
    draws, on every rank, the dropout masks the uninterrupted run would have drawn."""
    if world_size() == 1:
        return [value]
    values = [None] * world_size()
    dist.all_gather_object(values, value)
    return values


def _communication_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# Encoding and search


def encode_shard(model, texts: list, batch_size: int = 32, dtype: str = "float32") -> tuple[int, np.ndarray]:
    """Encode this rank's contiguous shard of `texts` (in precision `dtype`); returns (start,
    (stop - start, D) embeddings), start being the corpus row of the shard's first text."""
    start, stop = shard_range(len(texts))
    return start, encode_as(model, texts[start:stop], "document", batch_size=batch_size, dtype=dtype)


def merge_shard_top_k(shard_results: list, k: int, largest: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge per-shard top-k lists of the same queries into the top-k of the whole corpus.

    shard_results: [(scores, indices), ...], each (Q, k_s) with corpus row indices (not shard
    rows), best first, padded with index -1 where a shard had fewer rows. largest: False for
    euclidean distances. Returns (scores, indices), each (Q, min(k, sum k_s)): better score first,
    equal scores by lower corpus index (minisbert.search.plain's tie rule), padding last.
    """
    (scores, indices), *others = [(torch.as_tensor(s), torch.as_tensor(i)) for s, i in shard_results]
    for other_scores, other_indices in others:  # retrieval.merge_top_k merges two lists in any order
        scores, indices = merge_top_k(scores, indices, other_scores, other_indices, k, largest)
    return scores, indices


def gather_top_k(scores: torch.Tensor, indices: torch.Tensor, k: int, largest: bool = True):
    """Send every rank's (Q, k_r) shard top-k (corpus row indices) to rank 0 and merge them there.
    Returns the merged (scores, indices) as numpy arrays on rank 0, (None, None) on the others."""
    scores, indices = torch.as_tensor(scores).float().cpu(), torch.as_tensor(indices).long().cpu()
    if world_size() == 1:
        return scores.numpy(), indices.numpy()
    # gather needs equal shapes: a shard with fewer than k rows pads with index -1 and the worst score.
    pad = k - scores.shape[1]
    worst = float("-inf") if largest else float("inf")
    scores = torch.nn.functional.pad(scores, (0, pad), value=worst)  # (Q, k)
    indices = torch.nn.functional.pad(indices, (0, pad), value=-1)  # (Q, k)
    device = _communication_device()
    scores, indices = scores.to(device), indices.to(device)
    all_scores = [torch.empty_like(scores) for _ in range(world_size())] if is_main() else None
    all_indices = [torch.empty_like(indices) for _ in range(world_size())] if is_main() else None
    dist.gather(scores, all_scores, dst=0)
    dist.gather(indices, all_indices, dst=0)
    if not is_main():
        return None, None
    merged_scores, merged_indices = merge_shard_top_k(
        [(s.cpu(), i.cpu()) for s, i in zip(all_scores, all_indices)], k, largest)
    keep = int((merged_indices >= 0).sum(dim=1).max())  # drop columns that are padding in every row
    return merged_scores[:, :keep].numpy(), merged_indices[:, :keep].numpy()


def sharded_search(model, corpus_texts: list, query_texts: list, k: int, score: str = "cosine",
                   batch_size: int = 32, query_ids: list | None = None, corpus_ids: list | None = None,
                   dtype: str = "float32"):
    """Exact top-k over a corpus split across the ranks: encode this rank's shard, search it with
    minisbert.search.search, merge on rank 0. Every rank encodes the queries (they are few).
    Returns search's (scores, indices) on rank 0, (None, None) on the others."""
    start, shard = encode_shard(model, corpus_texts, batch_size, dtype)
    queries = encode_as(model, query_texts, "query", batch_size=batch_size, dtype=dtype)
    stop = start + shard.shape[0]
    if shard.shape[0] == 0:  # more ranks than documents: this rank contributes nothing
        scores, indices = torch.zeros((len(query_texts), 0)), torch.zeros((len(query_texts), 0), dtype=torch.long)
    else:  # on the model's device: a GPU searches its shard itself
        scores, indices = search(queries, shard, k, score=score, device=model.device, query_ids=query_ids,
                                 corpus_ids=corpus_ids[start:stop] if corpus_ids is not None else None)
        scores, indices = torch.as_tensor(scores).cpu(), torch.as_tensor(indices).cpu()
        indices = torch.where(indices >= 0, indices + start, -1)  # shard rows -> corpus rows
    return gather_top_k(scores, indices, min(k, len(corpus_texts)), largest=score != "euclidean")
