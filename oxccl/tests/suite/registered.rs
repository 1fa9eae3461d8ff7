//! Registered buffers (`Communicator::alloc`, `Communicator::register`) in every collective and
//! algorithm: the result must be bit for bit what the same call gives on plain buffers (which
//! tests/collectives.rs checks against closed forms), over the in-process, TCP and shared-memory
//! transports (which stage or copy directly: registration changes nothing there) and over verbs
//! (zero-copy sends; `#[ignore]`d without a device, `scripts/rxe-tests.sh` runs them in the
//! SoftRoCE VM). Also: the registered-bytes count and its bound (`CCL_REG_MAX_BYTES`).

use crate::common;

use std::time::Duration;

use ccl_core::config::TransportKind;
use ccl_core::test_values::{self, CheckValue};
use common::*;
use oxccl::{Algo, Collective, Communicator, ErrorKind, ReduceOp};

/// Collectives with a single count (the v-collectives take counts per rank; tests/vcoll.rs).
const COLLS: [Collective; 6] = [
    Collective::AllReduce,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
];

#[derive(Clone, Copy, Debug)]
enum Mem {
    Plain,
    /// `Communicator::register` on the caller's vectors.
    Register,
    /// `Communicator::alloc`.
    Alloc,
}

/// Runs `coll` with inputs from `test_values` on buffers of kind `mem` and returns the output.
fn run<T: CheckValue>(
    comm: &Communicator,
    coll: Collective,
    count: usize,
    in_place: bool,
    mem: Mem,
) -> Result<Vec<T>, oxccl::Error> {
    let (r, n) = (comm.rank(), comm.size());
    let lens = coll.buffer_lens(count, n).unwrap();
    let op = ReduceOp::Sum;
    let root = n - 1;
    let input: Vec<T> = (0..lens.send)
        .map(|i| T::from_i64(test_values::input(ReduceOp::Sum, r, i)))
        .collect();
    // In place: the input sits where NCCL puts it in the one buffer.
    let mut out: Vec<T> = vec![T::from_i64(99); if in_place { lens.in_place() } else { lens.recv }];
    if in_place {
        let at = if lens.send < lens.recv {
            r * lens.send
        } else {
            0
        };
        out[at..at + lens.send].copy_from_slice(&input);
    }
    let mut input = input;
    match mem {
        Mem::Plain => {
            let send = (!in_place).then_some(&input[..]);
            comm.collective(coll, send, &mut out, op, root)?;
        }
        Mem::Register => {
            let send = comm.register(&mut input)?;
            let mut recv = comm.register(&mut out)?;
            let s = (!in_place).then_some(&send[..]);
            comm.collective(coll, s, &mut recv, op, root)?;
        }
        Mem::Alloc => {
            let mut send = comm.alloc::<T>(input.len())?;
            send.copy_from_slice(&input);
            let mut recv = comm.alloc::<T>(out.len())?;
            recv.copy_from_slice(&out);
            let s = (!in_place).then_some(&send[..]);
            comm.collective(coll, s, &mut recv, op, root)?;
            out.copy_from_slice(&recv);
        }
    }
    Ok(out)
}

/// Every collective and algorithm at `counts`, in and out of place, registered (both kinds)
/// against plain; returns what differed.
fn sweep(comm: &Communicator, counts: &[usize]) -> Vec<String> {
    let mut wrong = Vec::new();
    for coll in COLLS {
        for algo in comm.algorithms(coll) {
            comm.set_algorithm(coll, Some(algo)).unwrap();
            for &c in counts {
                for in_place in [false, true] {
                    let plain = run::<f32>(comm, coll, c, in_place, Mem::Plain).unwrap();
                    for mem in [Mem::Register, Mem::Alloc] {
                        let got = run::<f32>(comm, coll, c, in_place, mem).unwrap_or_else(|e| {
                            panic!("rank {} {coll} {algo} {c} {mem:?}: {e}", comm.rank())
                        });
                        let bad = got
                            .iter()
                            .zip(&plain)
                            .filter(|(a, b)| a.to_bits() != b.to_bits())
                            .count();
                        if bad > 0 {
                            wrong.push(format!(
                                "rank {} {coll} {algo} count {c} in_place={in_place} {mem:?}: {bad} differ",
                                comm.rank()
                            ));
                        }
                    }
                }
            }
            comm.set_algorithm(coll, None).unwrap();
        }
    }
    // Nothing stays registered once the buffers are gone.
    assert_eq!(comm.registered_bytes(), (0, 0));
    wrong
}

fn sweep_over(t: TransportKind, sizes: &[usize], counts: &'static [usize]) {
    for &n in sizes {
        let wrong: Vec<String> = run_ranks(n, config(t, Duration::from_secs(120)), move |comm| {
            sweep(&comm, counts)
        })
        .into_iter()
        .flatten()
        .collect();
        assert!(wrong.is_empty(), "{t:?} {n} ranks:\n{}", wrong.join("\n"));
    }
}

#[test]
fn registered_equals_plain_over_local() {
    sweep_over(
        TransportKind::Local,
        &[1, 2, 3, 4],
        &[0, 1, 7, 1023, 70_001],
    );
}

#[test]
fn registered_equals_plain_over_tcp() {
    sweep_over(TransportKind::Tcp, &[2, 3], &[1, 1023, 70_001]);
}

#[test]
fn registered_equals_plain_over_shm() {
    sweep_over(TransportKind::Shm, &[2, 3], &[1, 1023, 70_001]);
}

/// Over verbs, sends out of registered memory are RDMA writes straight from it: counts that
/// fill many staging slots (the ring's credits wrap), every collective and algorithm.
#[cfg(feature = "ib")]
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_registered_equals_plain() {
    require_ib();
    sweep_over(TransportKind::Ib, &[2, 3], &[1, 1023, 1_000_003]);
}

/// A registered allreduce with 4 data QPs and sends split across them, so zero-copy pieces
/// complete out of order.
#[cfg(feature = "ib")]
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_registered_allreduce_split_over_qps() {
    require_ib();
    let mut cfg = config(TransportKind::Ib, Duration::from_secs(120));
    cfg.ib.qps_per_conn = 4;
    cfg.ib.split_data_on_qps = true;
    let wrong: Vec<String> = run_ranks(2, cfg, |comm| {
        let mut w = Vec::new();
        for c in [4096, (4 << 20) + 5] {
            for in_place in [false, true] {
                let plain = run::<f32>(&comm, Collective::AllReduce, c, in_place, Mem::Plain);
                let reg = run::<f32>(&comm, Collective::AllReduce, c, in_place, Mem::Alloc);
                if plain.unwrap() != reg.unwrap() {
                    w.push(format!("count {c} in_place={in_place}"));
                }
            }
        }
        w
    })
    .into_iter()
    .flatten()
    .collect();
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// Ranks that mix registered and plain buffers (rank 0 plain, 1 `register`, 2 `alloc`; both
/// sides of each connection differ): every collective and algorithm, odd counts, in and out of
/// place, gives the all-plain result. A registered receiver grants its output to a plain
/// sender (which stages into it) and a plain receiver copies a registered sender's bytes out of
/// its ring.
#[cfg(feature = "ib")]
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_mixed_registered_and_plain_ranks() {
    require_ib();
    let wrong: Vec<String> = run_ranks(
        3,
        config(TransportKind::Ib, Duration::from_secs(120)),
        |comm| {
            let mem = [Mem::Plain, Mem::Register, Mem::Alloc][comm.rank()];
            let mut w = Vec::new();
            for coll in COLLS {
                for algo in comm.algorithms(coll) {
                    comm.set_algorithm(coll, Some(algo)).unwrap();
                    for c in [1023, 300_007] {
                        for in_place in [false, true] {
                            let plain = run::<f32>(&comm, coll, c, in_place, Mem::Plain).unwrap();
                            let got = run::<f32>(&comm, coll, c, in_place, mem).unwrap();
                            if got
                                .iter()
                                .zip(&plain)
                                .any(|(a, b)| a.to_bits() != b.to_bits())
                            {
                                w.push(format!(
                                    "rank {} {coll} {algo} count {c} in_place={in_place} {mem:?}",
                                    comm.rank()
                                ));
                            }
                        }
                    }
                    comm.set_algorithm(coll, None).unwrap();
                }
            }
            w
        },
    )
    .into_iter()
    .flatten()
    .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Over verbs, a copying receive into registered memory takes no copy: the receiver grants
/// its output and the sender writes there. Checked with the connections' teardown counters
/// (`ccl_ibverbs::traffic`): in allgather, broadcast and allreduce (its allgather half) on
/// registered buffers, most received bytes land in place. A small ring bounds what a sender
/// can write before it sees a grant (each grant's range loses at most the ring's bytes).
#[cfg(feature = "ib")]
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_copying_receives_land_in_place() {
    require_ib();
    let mut cfg = config(TransportKind::Ib, Duration::from_secs(120));
    cfg.ib.slots = 4;
    cfg.ib.slot_size = 64 << 10;
    let count = (2 << 20) + 3;
    for coll in [
        Collective::AllGather,
        Collective::Broadcast,
        Collective::AllReduce,
    ] {
        let before = ccl_ibverbs::traffic();
        let ok = run_ranks(2, cfg.clone(), move |comm| {
            comm.set_algorithm(coll, Some(Algo::Ring)).unwrap();
            let plain = run::<f32>(&comm, coll, count, false, Mem::Plain).unwrap();
            let reg = run::<f32>(&comm, coll, count, false, Mem::Alloc).unwrap();
            plain == reg
        });
        assert!(
            ok.iter().all(|&o| o),
            "{coll}: registered differs from plain"
        );
        let after = ccl_ibverbs::traffic();
        let in_place = after.received_in_place - before.received_in_place;
        let staged = after.received_staged - before.received_staged;
        eprintln!("{coll}: received {in_place} bytes in place, {staged} through the ring");
        // Bytes the registered call receives by copying, over both ranks: allgather copies
        // all it receives (each rank gets the other's share), broadcast all (one rank
        // receives), a 2-rank ring allreduce the half it gathers (a half-share per rank).
        let bytes = (count * 4) as u64;
        let copied = match coll {
            Collective::AllGather => 2 * bytes,
            _ => bytes,
        };
        assert!(
            2 * in_place >= copied,
            "{coll}: only {in_place} of the {copied} bytes the registered call copies landed in \
             place ({staged} received through the ring, plain call included)"
        );
    }
}

#[test]
fn registered_bytes_are_counted_and_bounded() {
    let mut cfg = config(TransportKind::Local, Duration::from_secs(60));
    cfg.reg_max_bytes = 64 << 10;
    run_ranks(1, cfg, |comm| {
        assert_eq!(comm.registered_bytes(), (0, 0));
        let a = comm.alloc::<u32>(4096).unwrap();
        assert_eq!(a.len(), 4096);
        assert_eq!(a.as_ptr() as usize % 4096, 0, "page aligned");
        assert!(a.iter().all(|&x| x == 0), "zeroed");
        let mut v = vec![1u8; 32 << 10];
        let r = comm.register(&mut v).unwrap();
        assert_eq!(comm.registered_bytes(), ((16 << 10) + (32 << 10), 2));
        // 48 KiB held: another 32 KiB passes the 64 KiB bound.
        let e = comm.alloc::<u8>(32 << 10).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage, "{e}");
        let s = e.to_string();
        assert!(s.contains("CCL_REG_MAX_BYTES=65536"), "{s}");
        assert!(s.contains("49152 bytes are registered"), "{s}");
        drop(r);
        assert_eq!(comm.registered_bytes(), (16 << 10, 1));
        let b = comm.alloc::<u8>(32 << 10).unwrap();
        drop(a);
        drop(b);
        assert_eq!(comm.registered_bytes(), (0, 0));
        // The refused registration left nothing behind, and the vector is the caller's again.
        assert!(v.iter().all(|&x| x == 1));
    });
}

/// Non-blocking calls own an allocated buffer and give it back.
#[test]
fn alloc_buffers_go_through_non_blocking_calls() {
    let out = run_ranks(
        3,
        config(TransportKind::Local, Duration::from_secs(60)),
        |comm| {
            let mut b = comm.alloc::<i64>(1000).unwrap();
            for (i, x) in b.iter_mut().enumerate() {
                *x = (comm.rank() * 1000 + i) as i64;
            }
            let b = comm.all_reduce_async(b, ReduceOp::Sum).wait().unwrap();
            assert_eq!(comm.registered_bytes(), (8000, 1));
            b.to_vec()
        },
    );
    for v in out {
        for (i, x) in v.iter().enumerate() {
            assert_eq!(*x, (3 * i + 3000) as i64);
        }
    }
}
