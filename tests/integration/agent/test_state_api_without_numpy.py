"""The state API in an environment without numpy, like the agent image.

Where it sits: beside ``test_state_api.py`` (the SIGKILL/freeze scenario).
The agent image installs torch without numpy, and torch's
``all_gather_object`` decodes through ``Tensor.numpy()``: ``restore`` must
gather the copies' headers and broadcast a copy without it. Two real gloo
ranks on 127.0.0.1, numpy made unimportable before torch loads: rank 0
commits step 5, rank 1 holds no copy (a replacement) and receives rank 0's
state by broadcast.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from tests.integration.agent.gloo_ranks import rank_envs, run_ranks
from torchflex_agent.fence import Lease

RANK = textwrap.dedent(
    """
    import json, os, sys
    sys.modules["numpy"] = None  # the agent image has no numpy
    import torch
    import torch.distributed as dist
    from torchflex_agent.state import TrainState

    try:
        torch.zeros(1).numpy()
        numpy_works = True
    except RuntimeError:  # "Numpy is not available": what the agent image's torch says
        numpy_works = False
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
    torch.manual_seed(rank)  # different weights per rank: a broadcast must overwrite them
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TrainState(model=model, opt=opt)
    if rank == 0:
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        assert state.commit(5, loop={"epoch": 1})
    got = state.restore()
    print(json.dumps({
        "rank": rank,
        "step": got.step if got else None,
        "loop": got.loop if got else None,
        "broadcast": got.broadcast if got else None,
        "weight": model.weight.flatten().tolist(),
        "numpy": numpy_works,
    }), flush=True)
    dist.destroy_process_group()
    """
)


def test_restore_gathers_and_broadcasts_without_numpy(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease", duration=120.0)
    lease.grant(1, "inc", time.monotonic())
    folders = [tmp_path / f"shm-{rank}" for rank in range(2)]
    for folder in folders:
        folder.mkdir()
    results = run_ranks(RANK, rank_envs(folders, lease.path, 1))
    zero, one = sorted(results, key=lambda r: r["rank"])
    assert (zero["step"], zero["loop"], zero["broadcast"]) == (5, {"epoch": 1}, True)
    assert (one["step"], one["loop"], one["broadcast"]) == (5, {"epoch": 1}, True)
    assert one["weight"] == zero["weight"]
    assert zero["numpy"] is False and one["numpy"] is False  # the test blocked what it claims
