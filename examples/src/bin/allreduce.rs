//! The smallest ccl program: every rank contributes `rank + 1`, everyone gets the sum.
//!
//! Run it under any launcher, e.g. four local ranks through the library's own variables:
//!
//! ```text
//! cargo build --release -p ccl-examples
//! for r in 0 1 2 3; do
//!   CCL_RANK=$r CCL_WORLD_SIZE=4 CCL_COMM_ID=127.0.0.1:29555 target/release/allreduce &
//! done; wait
//! ```
//! or `mpirun -np 4 target/release/allreduce`, or `torchrun --nproc_per_node 4 --no-python
//! target/release/allreduce`.
#![forbid(unsafe_code)]

use oxccl::{Communicator, ReduceOp};

fn main() {
    let comm = match Communicator::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("allreduce example: {e}");
            std::process::exit(1);
        }
    };
    let (rank, n) = (comm.rank(), comm.size());
    let mine = vec![(rank + 1) as f64; 1 << 20];
    let mut sum = vec![0.0; mine.len()];
    if let Err(e) = comm.all_reduce(&mine, &mut sum, ReduceOp::Sum) {
        eprintln!("allreduce example: {e}");
        std::process::exit(1);
    }
    let want = (n * (n + 1) / 2) as f64;
    let ok = sum.iter().all(|&x| x == want);
    println!(
        "rank {rank} of {n} ({}): sum = {} ({})",
        comm.transport_name(),
        sum[0],
        if ok { "correct" } else { "WRONG" }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
