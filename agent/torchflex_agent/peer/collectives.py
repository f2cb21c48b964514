"""Small collectives of the state API, over any process group, without numpy.

Where it sits: used by ``state`` (the copy headers' gather, arming) and
``peer.ring`` (the slot headers' gather, the ring's node ranks); it imports
torch, so only training scripts import it, never the agent process.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist


def all_gather_json(value: Any, group: Any = None, device: torch.device | None = None) -> list[Any]:
    """Every rank's JSON-able ``value`` (a few hundred bytes), gathered without numpy.

    ``dist.all_gather_object`` decodes through ``Tensor.numpy()`` (torch 2.13),
    and the agent image has no numpy: the JSON goes padded to the longest as
    ``uint8`` tensors and is read back through a buffer the tensor shares.
    """
    dev = device if device is not None else torch.device("cpu")
    world = dist.get_world_size(group)
    data = json.dumps(value).encode()
    size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=dev)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    slots = [torch.zeros(longest, dtype=torch.uint8, device=dev) for _ in range(world)]
    dist.all_gather(slots, mine, group=group)
    out: list[Any] = []
    for slot, n in zip(slots, sizes, strict=True):
        raw = bytearray(int(n.item()))
        if raw:
            torch.frombuffer(raw, dtype=torch.uint8).copy_(slot[: len(raw)].cpu())
        out.append(json.loads(bytes(raw)))
    return out
