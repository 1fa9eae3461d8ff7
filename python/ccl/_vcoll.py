"""Gather, scatter, all-gather and all-to-all with per-rank sizes, for the torch backend.

ccl has no gather, scatter or v-collectives yet, so these are built from its grouped sends and
receives, as PyTorch's NCCL backend builds all-to-all-v from ncclSend/ncclRecv: one group per
call, in which every rank posts all its transfers, so none can deadlock. When the library gets
these collectives, this file is the one place to switch to them.

Buffers are 1-D uint8 tensors (byte views of the caller's tensors); a rank's own block is copied
locally. A transfer of 0 bytes is still posted, so both sides post the same transfers. Every
call blocks until its group has run.
"""

import ccl as _ccl


def gather(comm, root, send, recvs):
    """On `root`, ``recvs[r]`` receives rank r's `send`; other ranks pass ``recvs=None``."""
    with _ccl.group():
        if comm.rank != root:
            comm.send(send, root)
            return
        for r, buf in enumerate(recvs):
            if r == root:
                buf.copy_(send)
            else:
                comm.recv(buf, r)


def scatter(comm, root, sends, recv):
    """`recv` receives ``sends[rank]`` of `root`; other ranks pass ``sends=None``."""
    with _ccl.group():
        if comm.rank != root:
            comm.recv(recv, root)
            return
        for r, buf in enumerate(sends):
            if r == root:
                recv.copy_(buf)
            else:
                comm.send(buf, r)


def all_gather(comm, send, recvs):
    """``recvs[r]`` receives rank r's `send`, on every rank (sizes may differ by rank)."""
    me = comm.rank
    with _ccl.group():
        for r, buf in enumerate(recvs):
            if r == me:
                buf.copy_(send)
            else:
                comm.send(send, r)
                comm.recv(buf, r)


def all_to_all(comm, sends, recvs):
    """``sends[r]`` goes to rank r, whose ``recvs[rank]`` receives it (sizes may differ)."""
    me = comm.rank
    with _ccl.group():
        for r in range(comm.size):
            if r == me:
                recvs[r].copy_(sends[r])
            else:
                comm.send(sends[r], r)
                comm.recv(recvs[r], r)
