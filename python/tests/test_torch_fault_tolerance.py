"""torch's own fault-tolerance API on the oxccl backend: shrink_group, _reconfigure, abort hooks."""

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ranks import run_ranks  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "python" / "shrink_grow.py"


def test_a_rank_dies_the_survivors_shrink_and_a_replacement_joins():
    """The example end to end, twice: the last rank dies, then rank 0 (the process that runs
    the job's rendezvous and monitor). Each time the survivors' failed all_reduce names it,
    shrink_group leaves it out, the redone step is right, a replacement joins through
    _reconfigure, and the final weights equal an uninterrupted run's."""
    env = dict(os.environ, CCL_SOCKET_IFNAME="=lo")
    p = subprocess.run(
        [sys.executable, str(EXAMPLE), "--kill", "3", "--trials", "2", "--timeout", "20"],
        env=env, capture_output=True, text=True, timeout=900,
    )
    out = p.stdout + p.stderr[-3000:]
    assert p.returncode == 0, out
    assert "2/2 trials right" in p.stdout, out
    assert "kill rank 3" in p.stdout and "kill rank 0" in p.stdout, out


def _init(rank, size, store_file, **kw):
    import torch.distributed as dist

    dist.init_process_group(
        "oxccl", init_method="file://" + store_file, rank=rank, world_size=size, **kw
    )
    return dist


def reconfigure_errors_and_hooks(rank, size, uid, store_file, oob_file):
    import torch.distributed as dist

    _init(rank, size, store_file, timeout=timedelta(seconds=20))
    oob = dist.FileStore(oob_file, size)
    oob.set_timeout(timedelta(seconds=60))
    pg = dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    assert backend.supports_shrinking and pg.supports_reconfigure and backend.supports_abort_hooks

    mine = dist._get_reconfigure_handle()
    assert mine == dist._get_reconfigure_handle(), "one handle until a reconfigure uses it"
    with pytest.raises(RuntimeError, match="is not a reconfigure handle"):
        dist._reconfigure(uuid=1, handles=["nonsense"])
    with pytest.raises(RuntimeError, match="handle is not among"):
        dist._reconfigure(uuid=1, handles=[mine[:-1] + ("0" if mine[-1] != "0" else "1")])

    # Members that disagree on the uuid: both fail, naming the difference.
    oob.set(f"h/{rank}", mine)
    oob.wait([f"h/{r}" for r in range(size)])
    handles = [oob.get(f"h/{r}").decode() for r in range(size)]
    with pytest.raises(RuntimeError, match="different uuids"):
        dist._reconfigure(uuid=100 + rank, handles=handles)
    # The group still works on its old communicator.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [size] * 3

    # A set of handles: the backend orders them itself, the same on every member.
    fresh = dist._get_reconfigure_handle()
    assert fresh != mine, "a reconfigure that used the handle's rendezvous makes a new one"
    oob.set(f"s/{rank}", fresh)
    oob.wait([f"s/{r}" for r in range(size)])
    members = {oob.get(f"s/{r}").decode() for r in range(size)}
    dist._reconfigure(uuid=7, handles=members).wait()
    assert dist.get_world_size() == size
    assert dist.get_rank() == sorted(members).index(fresh)
    t = torch.full((3,), float(dist.get_rank()))
    dist.all_reduce(t)
    assert t.tolist() == [sum(range(size))] * 3

    # Abort hooks run, in registration order, before the group aborts; an unregistered one not.
    ran = []
    pg.register_abort_hook(1, lambda: ran.append("first"))
    pg.register_abort_hook(2, lambda: ran.append("gone"))
    pg.register_abort_hook(3, lambda: ran.append("second"))
    pg.unregister_abort_hook(2)
    dist.barrier()
    backend.abort()
    assert ran == ["first", "second"]
    with pytest.raises(RuntimeError, match="aborted"):
        dist.all_reduce(torch.ones(1))


def test_reconfigure_errors_and_abort_hooks(tmp_path):
    run_ranks(reconfigure_errors_and_hooks, 3, str(tmp_path / "store"), str(tmp_path / "oob"))


def shrink_abort_and_exclusion(rank, size, uid, store_file):
    """SHRINK_ABORT ends a pending operation at once; a rank can be excluded while alive (it
    calls nothing); an excluded rank's own call is refused by torch."""
    import torch.distributed as dist

    _init(rank, size, store_file, timeout=timedelta(seconds=20))
    dist.barrier()
    if rank == 2:
        # Left out by the others while alive: it only waits for them to finish.
        with pytest.raises(RuntimeError, match="exclusion list"):
            dist.shrink_group([2])
        dist.FileStore(store_file + ".done", 1).wait(["done"], timedelta(seconds=60))
        return
    sub = dist.shrink_group([2], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    assert sub.size() == size - 1 and dist.get_world_size() == size - 1
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 4
    dist.barrier()
    if rank == 0:
        dist.FileStore(store_file + ".done", 1).set("done", "1")


def test_shrink_abort_leaves_out_a_live_rank(tmp_path):
    run_ranks(shrink_abort_and_exclusion, 3, str(tmp_path / "store"))
