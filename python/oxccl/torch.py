"""The ``"oxccl"`` backend of ``torch.distributed``, for CPU tensors.

    import torch.distributed as dist
    dist.init_process_group("oxccl")     # under torchrun; no import needed (entry point)
    model = torch.nn.parallel.DistributedDataParallel(model)

The backend is a C++ ``c10d::Backend`` (``csrc/backend.cpp``, module ``oxccl._ctorch``) calling
the library through its C ABI. torch finds it by name through the ``torch.distributed.backends``
entry point this package declares, which calls ``register()``; importing this module registers
it too. See docs/torch.md for what each operation does.

A C++ extension only loads into the torch it was compiled against, so the package records which
torch its extension was built for. When the torch that runs is another one (upgraded since the
install, or installed after the package), the first import compiles the backend for it into a
per-user cache (``~/.cache/oxccl``, ``CCL_TORCH_EXT_DIR``; one process builds while the others
of a job wait), which takes about 30 s once. If that cannot be done (no C++ compiler or no
Python headers, or ``CCL_TORCH_BUILD=0``), the import fails naming both torch versions and what
to install: there is no slower fall-back that would run silently instead.

Fault tolerance (torch's own API, on the native backend): ``dist.shrink_group(ranks)`` makes the
survivors' group (``SHRINK_ABORT`` revokes pending operations first); ``init_process_group(...,
enable_reconfigure=True)``, ``dist._get_reconfigure_handle()`` and ``dist._reconfigure(uuid,
handles)`` build a group from a list of processes (a replacement joins that way); abort hooks
run before a group aborts or first fails. ``failed_ranks(group)`` names the ranks the job's
monitor has seen die.
"""

import fcntl
import importlib.util
import logging
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import oxccl as _oxccl
from oxccl import _build

__all__ = ["BACKEND", "ProcessGroupOxccl", "register", "failed_ranks"]
_log = logging.getLogger("oxccl.torch")

BACKEND = "oxccl"


def _import_from(path):
    spec = importlib.util.spec_from_file_location(f"oxccl.{_build.MODULE}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[spec.name] = mod
    return mod


def _native():
    """The compiled backend for the torch that runs: the package's own build when it was made
    for this torch, else one in the cache, else one compiled now."""
    import sysconfig

    want = {"torch": torch.__version__, "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX")}
    shipped, module = _build.recorded(_build.HERE)
    if shipped == want:
        return _import_from(module)
    facts = _build.local_facts()
    cache = os.environ.get("CCL_TORCH_EXT_DIR") or _build.cache_dir(facts)
    cached, module = _build.recorded(cache)
    if cached == want:
        return _import_from(module)
    why = (
        f"the installed one was built for torch {shipped['torch']}, this is torch "
        f"{torch.__version__}"
        if shipped
        else f"the package was installed without it (no torch was visible to the install); "
        f"this is torch {torch.__version__}"
    )
    if os.environ.get("CCL_TORCH_BUILD", "1") == "0":
        raise ImportError(
            f"oxccl.torch: no native backend for this torch: {why}, and CCL_TORCH_BUILD=0 "
            "forbids compiling one now. Reinstall the package with this torch present "
            "(pip install --no-build-isolation ./python) or unset CCL_TORCH_BUILD."
        )
    os.makedirs(cache, exist_ok=True)
    # One process of a job compiles; the others wait for it and load its build.
    with open(os.path.join(cache, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached, module = _build.recorded(cache)
        if cached != want:
            _log.warning("oxccl.torch: %s; compiling the backend for it into %s", why, cache)
            try:
                module = _build.build(facts, cache, log=_log.info)
            except _build.BuildError as e:
                raise ImportError(f"oxccl.torch: no native backend for this torch: {why}. {e}") from None
    return _import_from(module)


_ctorch = _native()
_ctorch.load_library(_oxccl._lib.path)
ProcessGroupOxccl = _ctorch.ProcessGroupOxccl


def _borrowed_comm(pg):
    """The backend's communicator as an ``oxccl.Communicator`` (revoke, shrink, failed_ranks),
    which the group keeps owning; None once the group was shut down or is waiting for its
    first reconfigure."""
    h = pg._comm_handle()
    return _oxccl.Communicator._borrow(h) if h else None


ProcessGroupOxccl.comm = property(_borrowed_comm)

_fr_prefix = None
_fr_groups = 0


def _flight_recorder_from_torch_env():
    """Asks for dumps in PyTorch's flight-recorder format where torch's own variables ask for a
    flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE`` above 0, ``TORCH_NCCL_DUMP_ON_TIMEOUT`` not
    off), at torch's path (``TORCH_FR_DUMP_TEMP_FILE`` + rank), unless ``CCL_TRACE_TORCH_FILE``
    is set. The first group of a process writes there; later groups (whose ranks are not the
    global ones) add their communicator id to the name so that nothing is overwritten (the
    analyser then needs ``-p`` for them)."""
    global _fr_prefix, _fr_groups

    try:
        size = int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0"))
    except ValueError:
        return
    if size <= 0 or os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "1").lower() in ("0", "false"):
        return
    if _fr_prefix is None:
        if os.environ.get("CCL_TRACE_TORCH_FILE"):
            return  # the user's own choice
        _fr_prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "/tmp/nccl_trace_rank_")
    os.environ["CCL_TRACE_TORCH_FILE"] = _fr_prefix if _fr_groups == 0 else _fr_prefix + "%c_"
    os.environ.setdefault("CCL_TRACE_BUFFER", str(size))
    _fr_groups += 1


def _create(dist_opts, backend_opts):
    """torch's extended creator: the group's store, rank, size and timeout, and whether it is
    made in the reconfigure regime (no communicator until ``_reconfigure``)."""
    timeout = dist_opts.timeout if dist_opts.timeout is not None else timedelta(minutes=30)
    _flight_recorder_from_torch_env()
    return ProcessGroupOxccl(
        dist_opts.store,
        dist_opts.group_rank,
        dist_opts.group_size,
        int(timeout.total_seconds() * 1000),
        bool(getattr(dist_opts, "enable_reconfigure", False)),
    )


def register():
    """Registers the ``"oxccl"`` backend for CPU tensors (torch calls this through the
    ``torch.distributed.backends`` entry point the first time a group names it)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    # The library records every operation itself (its flight recorder, dumped in torch's format
    # where torch's variables ask: see _flight_recorder_from_torch_env), as Gloo and NCCL do, so
    # torch need not hook its own recorder into every call of the group (about 1 us of CPU per
    # operation: it reads the thread's name with a system call for each entry). torch keeps
    # the set of such backends here; an older torch without it has no such hook either.
    self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if self_recording is not None:
        self_recording.add(BACKEND)


def failed_ranks(group=None):
    """The ranks of `group` (default: the default group) that the job's monitor has reported
    failed or dead: what to pass to ``dist.shrink_group`` after an operation failed."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    comm = pg._get_backend(torch.device("cpu")).comm
    if comm is None:
        raise RuntimeError("oxccl.torch.failed_ranks: the group has no communicator")
    return comm.failed_ranks()


register()
