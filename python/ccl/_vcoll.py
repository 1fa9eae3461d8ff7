"""Gather, scatter, all-gather and all-to-all with per-rank sizes, for the torch backend.

Each is one library collective: ``cclGather``, ``cclScatter``, ``cclAllGatherV`` and
``cclAlltoAllV``. The library takes one buffer per side with a displacement per rank, torch a
list of tensors: when the tensors of a list are views of one storage (``all_to_all_single``'s
splits, chunks of one tensor) the storage is passed with their offsets and data lands in place;
otherwise they are packed into one buffer (sends) or unpacked from one (receives), one copy.

Buffers are 1-D uint8 tensors (byte views of the caller's tensors). Every call blocks until the
collective has run; ranks whose sizes disagree get the library's error naming the peer.
"""

import torch


def _storage_ptr(t):
    return t.untyped_storage().data_ptr()


def _packed(bufs):
    """A new buffer for `bufs` back to back, and where each starts in it."""
    displs, off = [], 0
    for b in bufs:
        displs.append(off)
        off += b.numel()
    return torch.empty(off, dtype=torch.uint8), displs, True


def _layout(bufs, avoid=None):
    """``(base, displs, packed)``: a uint8 tensor holding every buffer and where each starts in
    it. The buffers' own storage when they all share one (``packed`` False), else a new buffer
    with them back to back (``packed`` True: copy in before a send, out after a receive). A
    storage that `avoid` (a tensor) also lives in is not used: the library refuses send and
    receive buffers that overlap."""
    live = [b for b in bufs if b.numel() > 0]
    if not live or any(_storage_ptr(b) != _storage_ptr(live[0]) for b in live):
        return _packed(bufs)
    if avoid is not None and avoid.numel() > 0 and _storage_ptr(avoid) == _storage_ptr(live[0]):
        return _packed(bufs)
    base = torch.empty(0, dtype=torch.uint8).set_(live[0].untyped_storage())
    start = base.data_ptr()
    return base, [b.data_ptr() - start if b.numel() else 0 for b in bufs], False


def _pack(base, displs, bufs):
    for b, d in zip(bufs, displs):
        base[d : d + b.numel()].copy_(b)


def _unpack(base, displs, bufs):
    for b, d in zip(bufs, displs):
        b.copy_(base[d : d + b.numel()])


def _sizes_differ(bufs, size):
    return any(b.numel() != size for b in bufs)


def gather(comm, root, send, recvs):
    """On `root`, ``recvs[r]`` receives rank r's `send`; other ranks pass ``recvs=None``.
    Every rank's `send` has the same size (ranks that differ get the library's error)."""
    if comm.rank != root:
        comm.gather(send, None, root=root)
        return
    k = send.numel()
    flat = torch.empty(k * len(recvs), dtype=torch.uint8)
    comm.gather(send, flat, root=root)
    # Checked after the collective, which every rank has then completed: nobody waits on a
    # root that refused.
    if _sizes_differ(recvs, k):
        sizes = [b.numel() for b in recvs]
        raise ValueError(f"gather: every output must have the input's {k} bytes, got {sizes}")
    _unpack(flat, [r * k for r in range(len(recvs))], recvs)


def scatter(comm, root, sends, recv):
    """`recv` receives ``sends[rank]`` of `root`; other ranks pass ``sends=None``. Every
    rank's `recv` has the same size (ranks that differ get the library's error)."""
    if comm.rank != root:
        comm.scatter(None, recv, root=root)
        return
    k = recv.numel()
    if _sizes_differ(sends, k):
        # The other ranks are already waiting for this root's data: failing the communicator
        # ends their wait at once ("rank <root> failed: aborted") instead of at the timeout.
        sizes = [b.numel() for b in sends]
        comm.abort()
        raise ValueError(
            f"scatter: every input must have the output's {k} bytes, got {sizes} (the "
            "communicator was aborted so that the other ranks do not wait for it)"
        )
    flat = torch.cat(sends) if sends else torch.empty(0, dtype=torch.uint8)
    comm.scatter(flat, recv, root=root)


def all_gather(comm, send, recvs):
    """``recvs[r]`` receives rank r's `send`, on every rank (sizes may differ by rank)."""
    base, displs, packed = _layout(recvs, avoid=send)
    counts = [b.numel() for b in recvs]
    comm.all_gather_v(send, base, counts, displs)
    if packed:
        _unpack(base, displs, recvs)


def all_to_all(comm, sends, recvs):
    """``sends[r]`` goes to rank r, whose ``recvs[rank]`` receives it (sizes may differ)."""
    sbase, sdispls, spacked = _layout(sends)
    if spacked:
        _pack(sbase, sdispls, sends)
    rbase, rdispls, rpacked = _layout(recvs, avoid=sbase)
    comm.all_to_all_v(
        sbase,
        [b.numel() for b in sends],
        rbase,
        [b.numel() for b in recvs],
        send_displs=sdispls,
        recv_displs=rdispls,
    )
    if rpacked:
        _unpack(rbase, rdispls, recvs)
