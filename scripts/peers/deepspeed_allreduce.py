"""Times DeepSpeed's shared-memory inference allreduce (deepspeed.comm.inference_all_reduce on the
CPU accelerator, sum, in place) the way mpi_allreduce.c times MPI_Allreduce: per size WARMUP
untimed calls, a barrier, ITERS timed calls, the time the maximum over ranks, busbw = bytes /
time * 2(n-1)/n (GB = 1e9 bytes), every size checked once.

    python deepspeed_allreduce.py NP MIN_BYTES MAX_BYTES FACTOR ITERS WARMUP [float|bf16]

starts NP ranks (processes of this script, rank r bound to the r-th usable CPU unless they
outnumber the CPUs) and prints one line per size: "bytes time_us busbw_GBps check". Sizes the
kernel cannot take print "bytes n/a n/a n/a": DeepSpeed counts a tensor's bytes in an int, and
when the CPU lacks the ISA its kernel needs for the dtype (AVX2 for float32, AVX512BW for bf16) it
quietly hands the call to the process group's all_reduce instead, which is not what this measures.

The call is in place only; the timed calls run on zeros so that repeated sums stay finite, and
the check runs once more on rank + 1 (small integers, exact in bf16). Gloo serves the rendezvous,
barriers and the max over ranks; the ranks meet through a file:// store (torch's TCP store looks
its peers' addresses up in DNS), Gloo is held to loopback, and the kernel's shared-memory
segments, which DeepSpeed leaves behind, are removed after the run. Rank 0 names the versions on
stderr. DeepSpeed builds the kernel with g++ and ninja on its first use; run with --build first so
that no timed run includes that.
"""

import glob
import os
import random
import subprocess
import sys
import tempfile
import time

SEGMENT = "/dev/shm/deepspeed_allreduce_buffer_{uid}_127.0.0.1_{port}_*"


def launch(argv):
    np_ = int(argv[0])
    cpus = sorted(os.sched_getaffinity(0))
    port = random.randrange(20000, 60000)
    with tempfile.TemporaryDirectory(prefix="ds-allreduce.") as d:
        procs = []
        for r in range(np_):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(np_), LOCAL_RANK=str(r),
                       LOCAL_SIZE=str(np_), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       DS_STORE=os.path.join(d, "store"), DS_ACCELERATOR="cpu",
                       GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            if np_ <= len(cpus):
                env["DS_BIND_CPU"] = str(cpus[r])
            procs.append(subprocess.Popen([sys.executable, __file__, "--rank"] + argv[1:], env=env))
        status = 0
        try:
            while any(p.poll() is None for p in procs):
                if any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                status = status or p.wait()
            for f in glob.glob(SEGMENT.format(uid=os.getuid(), port=port)):
                os.unlink(f)
    return status


def rank_main(argv):
    if "DS_BIND_CPU" in os.environ:
        os.sched_setaffinity(0, {int(os.environ["DS_BIND_CPU"])})
    lo, hi, factor, iters, warmup = (int(a) for a in argv[:5])
    dtype_name = argv[5] if len(argv) > 5 else "float"
    import torch
    import torch.distributed as tdist
    import deepspeed
    import deepspeed.comm as dist

    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, rank=rank, world_size=n,
                          init_method="file://" + os.environ["DS_STORE"])
    dtype = {"float": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    backend = dist.comm.cdb
    # The test DeepSpeed makes before each call: where it fails, the call is Gloo's all_reduce.
    # (Releases without the ISA level took the kernel whenever it was built.)
    level = getattr(backend, "shm_vector_kernel_level", 2)
    kernel = (getattr(backend, "shm_comm_op", None) is not None
              and hasattr(torch.ops, "deepspeed")
              and hasattr(torch.ops.deepspeed, "inference_all_reduce_")
              and level >= (1 if dtype == torch.float32 else 2))
    if rank == 0:
        print(f"deepspeed_allreduce: library: DeepSpeed {deepspeed.__version__}, torch "
              f"{torch.__version__}; {dtype_name}: "
              + ("shared-memory kernel" if kernel else "NO shared-memory kernel for it here: n/a"),
              file=sys.stderr, flush=True)
    esize = torch.tensor([], dtype=dtype).element_size()
    want = n * (n + 1) / 2

    def slowest(x, op=tdist.ReduceOp.MAX):
        t = torch.tensor([x], dtype=torch.float64)
        tdist.all_reduce(t, op=op)
        return t.item()

    b = lo
    while b <= hi:
        count = b // esize
        if not kernel or b >= 1 << 31:
            line = f"{b} n/a n/a n/a"
        else:
            x = torch.zeros(count, dtype=dtype)
            for _ in range(warmup):
                dist.inference_all_reduce(x)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.inference_all_reduce(x)
            t = slowest((time.perf_counter() - t0) / iters)
            x.fill_(rank + 1)
            dist.inference_all_reduce(x)
            ok = slowest(float(bool((x == want).all())), tdist.ReduceOp.MIN) == 1.0
            bw = b / t / 1e9 * 2 * (n - 1) / n
            line = f"{b} {t * 1e6:.3f} {bw:.4f} {'ok' if ok else 'WRONG'}"
        if rank == 0:
            print(line, flush=True)
        if factor <= 1:
            break
        b *= factor
    dist.barrier()
    tdist.destroy_process_group()
    return 0


def build():
    from deepspeed.accelerator import get_accelerator

    get_accelerator().create_op_builder("ShareMemCommBuilder").load()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        sys.exit(rank_main(sys.argv[2:]))
    if sys.argv[1:2] == ["--build"]:
        sys.exit(build())
    if len(sys.argv) not in (7, 8):
        sys.exit(__doc__.split("\n\n")[1])
    sys.exit(launch(sys.argv[1:]))
