"""minitransformer.distributed in one process: `distributed()` outside torchrun is one rank, and
`shard_batch` keeps this rank's rows and names what is wrong (torchrun itself:
tests/integration/test_torchrun.py)."""

import gc
import socket
import weakref

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from minitransformer.core import default_device
from minitransformer.distributed import Rank, distributed, shard_batch

pytestmark = pytest.mark.timeout(300)


# --- in one process, without torchrun ---------------------------------------------
def test_distributed_outside_torchrun_is_one_rank(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with distributed() as r:
        assert isinstance(r, Rank)
        assert r == Rank(0, 1, 0, default_device())
        assert not dist.is_initialized()
    with pytest.raises(ValueError, match="backend"):
        with distributed("mpi"):
            pass
    monkeypatch.setenv("WORLD_SIZE", "2")  # RANK and LOCAL_RANK missing
    with pytest.raises(RuntimeError, match="torchrun environment is incomplete"):
        with distributed():
            pass


def test_leaving_the_group_waits_and_frees_ddp_wrappers_first(monkeypatch):
    "A DDP wrapper dropped inside the group is freed before the group is destroyed."
    with socket.socket() as s:  # a free port for a group of one
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        monkeypatch.setenv(key, value)
    seen, destroy, barrier = [], dist.destroy_process_group, dist.barrier
    monkeypatch.setattr(dist, "barrier", lambda: (seen.append("barrier"), barrier()))
    monkeypatch.setattr(dist, "destroy_process_group",
                        lambda: (seen.append(wrapper() is None), destroy()))
    gc.disable()  # (only distributed() may collect)
    try:
        with distributed("gloo"):
            net = DistributedDataParallel(torch.nn.Linear(2, 2))
            net(torch.ones(1, 2)).sum().backward()
            net.itself, wrapper = net, weakref.ref(net)  # a cycle, as a trainer's
            del net  # alive until a collection
            assert wrapper() is not None
    finally:
        gc.enable()
    assert seen == ["barrier", True] and not dist.is_initialized()


def test_shard_batch_keeps_this_ranks_rows():
    x, y = torch.arange(12).view(6, 2), torch.arange(6)
    assert torch.equal(shard_batch(x), x)  # one process: the whole batch
    a, b = shard_batch((x, y), rank=1, world_size=3)
    assert torch.equal(a, x[2:4]) and torch.equal(b, y[2:4])
    assert isinstance(shard_batch([x, y], 0, 2), tuple)
    assert torch.equal(torch.cat([shard_batch(x, r, 3) for r in range(3)]), x)


@pytest.mark.parametrize("args,error,name", [
    ((torch.zeros(4, 2), 2, 2), ValueError, "rank"),
    ((torch.zeros(4, 2), -1, 2), ValueError, "rank"),
    ((torch.zeros(4, 2), 0, 0), ValueError, "world_size"),
    ((torch.zeros(5, 2), 0, 2), ValueError, "world_size"),
    (((torch.zeros(4, 2), torch.zeros(6)), 0, 2), ValueError, "batch.*first dimension"),
    (([[1, 2], [3, 4]], 0, 2), TypeError, "batch"),
    (((torch.zeros(4), "y"), 0, 2), TypeError, "batch"),
    ((torch.tensor(3.0), 0, 1), TypeError, "batch"),
    (((), 0, 1), TypeError, "batch"),
])
def test_shard_batch_names_what_is_wrong(args, error, name):
    with pytest.raises(error, match=name):
        shard_batch(*args)
