"""The microscope's point-to-point probe: round-trip time from this rank to every other.

Every rank runs it at the same step (between steps, where no collective is in flight), on
the trainer's own process group and backend (gloo or NCCL), so it measures the links the
job uses. Pairs are scheduled round by round (the circle method: in each round every rank
has one partner, or sits out when the number of ranks is odd); in each pair the lower rank
sends one value and the higher sends it back, once to meet and then ``ROUNDS`` times timed.
The figure kept is the median round trip. A send/recv tag of its own keeps its messages
apart from the trainer's.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

ROUNDS = 5
TAG = 0x7470  # "tp"


def pairings(world_size: int) -> list[dict[int, int]]:
    """Rounds of partners: in each, rank -> its partner (every pair exactly once overall)."""
    ranks: list[int | None] = list(range(world_size)) + ([None] if world_size % 2 else [])
    n = len(ranks)
    rounds: list[dict[int, int]] = []
    for _ in range(n - 1):
        partners: dict[int, int] = {}
        for i in range(n // 2):
            a, b = ranks[i], ranks[n - 1 - i]
            if a is not None and b is not None:
                partners[a], partners[b] = b, a
        rounds.append(partners)
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]
    return rounds


def probe(rank: int, world_size: int) -> dict[int, float]:
    """Median round trip in microseconds from ``rank`` to each other rank (every rank of the
    default process group must call this at the same point)."""
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    value = torch.zeros(1, device=device)
    out: dict[int, float] = {}
    for partners in pairings(world_size):
        peer = partners.get(rank)
        if peer is None:
            continue
        times = []
        for i in range(ROUNDS + 1):
            started = time.perf_counter()
            if rank < peer:
                dist.send(value, peer, tag=TAG)
                dist.recv(value, peer, tag=TAG)
            else:
                dist.recv(value, peer, tag=TAG)
                dist.send(value, peer, tag=TAG)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i:  # the first exchange waits for the partner to arrive
                times.append((time.perf_counter() - started) * 1e6)
        out[peer] = statistics.median(times)
    return out
