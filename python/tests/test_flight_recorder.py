"""Dumps in PyTorch's flight-recorder format, read by the analyser of the installed torch.

A 4-rank job hangs on purpose: one rank stays in its own code instead of making the sixth
allreduce. The survivors time out and their errors carry ccl's verdict; every rank dumps (the
one in its own code when it hears of the failure); PyTorch's analyser, run on the dumps, must
name the same rank as the one missing from the same collective. The same through the torch
backend, where torch's own variables (TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE)
ask for the dumps.
"""

import os
import pickle
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import oxccl as ccl
from ranks import run_ranks

pytest.importorskip(
    "torch.distributed.flight_recorder.fr_trace",
    reason="the installed torch has no flight-recorder analyser",
)

SIZE = 4
CULPRIT = 2
DONE = 5  # allreduces every rank finishes; the culprit never makes the next one


def stay_in_own_code_until(dump):
    """Busy elsewhere (never making the next call) until this rank's dump is there: its
    monitor thread writes it when it hears of the failure."""
    deadline = time.monotonic() + 60
    while not os.path.exists(dump):
        assert time.monotonic() < deadline, "the rank in its own code wrote no dump"
        time.sleep(0.05)


def hang_in_own_code(rank, size, uid, out):
    comm = ccl.Communicator(rank, size, uid, timeout=3)
    x = np.ones(4096, dtype=np.float32)
    for _ in range(DONE):
        comm.all_reduce(x)
    if rank == CULPRIT:
        stay_in_own_code_until(os.environ["CCL_TRACE_TORCH_FILE"] + str(rank))
        return
    with pytest.raises(ccl.CclError) as e:
        comm.all_reduce(x)
    with open(os.path.join(out, f"error{rank}"), "w") as f:
        f.write(e.value.message)


def test_the_analyser_names_the_rank_the_verdict_names(tmp_path, monkeypatch):
    fr = tmp_path / "fr"
    fr.mkdir()
    monkeypatch.setenv("CCL_TRACE_TORCH_FILE", str(fr / "ccl_fr_"))
    run_ranks(hang_in_own_code, SIZE, str(tmp_path))

    seq = DONE + 1
    for r in range(SIZE):
        if r == CULPRIT:
            continue
        msg = (tmp_path / f"error{r}").read_text()
        assert f"verdict: allreduce #{seq} (" in msg, msg
        assert f"is stuck behind rank {CULPRIT} (" in msg and "never entered it" in msg, msg
    assert sorted(os.listdir(fr)) == [f"ccl_fr_{r}" for r in range(SIZE)]
    with open(fr / f"ccl_fr_{CULPRIT}", "rb") as f:
        dump = pickle.load(f)
    assert [e["collective_seq_id"] for e in dump["entries"]] == list(range(1, seq))

    analyse(fr, tmp_path, seq, CULPRIT)


def analyse(fr, tmp_path, seq, culprit):
    """Runs PyTorch's analyser on the dumps in `fr`: it must find collective `seq` missing
    `culprit` and every earlier one matched on all ranks."""
    db = tmp_path / "db.pkl"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(fr), "-o", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert f"Not all ranks joining collective, sequence number: {seq}" in report, report
    assert f"missing ranks: {{{culprit}}}" in report, report
    with open(db, "rb") as f:
        _types, database = pickle.load(f)
    failing = [c for c in database.collectives if c.missing_ranks]
    assert [(c.collective_seq_id, c.missing_ranks) for c in failing][:1] == [(seq, {culprit})]
    assert all(c.pass_check for c in database.collectives if c.collective_seq_id < seq)


def torch_job_hangs(rank, size, uid, store_file, out):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import oxccl.torch  # noqa: F401

    dist.init_process_group(
        "oxccl",
        init_method="file://" + store_file,
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=3),
    )
    t = torch.ones(1000)
    for _ in range(DONE):
        dist.all_reduce(t)
    if rank == 1:
        stay_in_own_code_until(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank))
        return
    with pytest.raises(Exception) as e:  # noqa: PT011 - whatever torch wraps it in
        dist.all_reduce(t)
    with open(os.path.join(out, f"error{rank}"), "w") as f:
        f.write(str(e.value))


def test_torch_backend_dumps_where_torch_variables_ask(tmp_path, monkeypatch):
    pytest.importorskip("torch.distributed")
    fr = tmp_path / "fr"
    fr.mkdir()
    monkeypatch.delenv("CCL_TRACE_TORCH_FILE", raising=False)
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "100")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(fr / "nccl_trace_rank_"))
    run_ranks(torch_job_hangs, 3, str(tmp_path / "store"), str(tmp_path))

    seqs = set()
    for r in (0, 2):
        msg = (tmp_path / f"error{r}").read_text()
        m = re.search(r"verdict: allreduce #(\d+) \(.*is stuck behind rank 1 \(", msg)
        assert m and "never entered it" in msg, msg
        seqs.add(int(m.group(1)))
    assert len(seqs) == 1, seqs
    assert sorted(os.listdir(fr)) == [f"nccl_trace_rank_{r}" for r in range(3)]
    analyse(fr, tmp_path, seqs.pop(), 1)
