//! Gather, scatter, allgatherv, reduce-scatterv and alltoallv with ranks as threads: world sizes
//! 1..=5 over the in-process and TCP transports, counts with zeros, blocks out of rank order
//! with gaps, roots other than 0, in place and out of place, blocking and non-blocking, against
//! closed-form results; and counts that disagree between ranks, which must fail fast on both
//! sides naming the peer, never hang or misplace data.

use crate::common;

use std::time::{Duration, Instant};

use ccl_core::config::TransportKind;
use ccl_core::test_values::CheckValue;
use common::*;
use oxccl::{Communicator, Counts, ReduceOp};

/// Rank `r`'s input element `i`: exact in every type used here.
fn val<T: CheckValue>(r: usize, i: usize) -> T {
    T::from_i64((r * 1000 + i % 1000) as i64 % 120)
}

const POISON: i64 = 99;

fn poison<T: CheckValue>(len: usize) -> Vec<T> {
    vec![T::from_i64(POISON); len]
}

/// Indices where `got` differs from `want`, for a readable failure.
fn wrong<T: CheckValue>(what: &str, got: &[T], want: &[T]) -> Vec<String> {
    if got.len() != want.len() {
        return vec![format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        )];
    }
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| bytemuck::bytes_of(&got[i]) != bytemuck::bytes_of(&want[i]))
        .collect();
    if bad.is_empty() {
        Vec::new()
    } else {
        vec![format!("{what}: {} wrong, first at {}", bad.len(), bad[0])]
    }
}

/// Gather and scatter at `root`, `c` elements per rank, every placement.
fn rooted<T: CheckValue>(comm: &Communicator, c: usize, root: usize) -> Vec<String> {
    let (r, n) = (comm.rank(), comm.size());
    let mut out = Vec::new();
    let tag = |what: &str| format!("rank {r} {what} c={c} root={root} {}", T::DTYPE);
    let all: Vec<T> = (0..n * c).map(|j| val(j / c, j % c)).collect();
    let mine: Vec<T> = (0..c).map(|i| val(r, i)).collect();
    // Gather, out of place; a non-root passes an empty output.
    let mut recv = if r == root { poison(n * c) } else { Vec::new() };
    comm.gather(&mine, &mut recv, root).unwrap();
    if r == root {
        out.extend(wrong(&tag("gather"), &recv, &all));
    }
    // Gather in place: the input is block `rank` of the buffer; other ranks' buffers keep theirs.
    let mut buf = poison::<T>(n * c);
    buf[r * c..(r + 1) * c].copy_from_slice(&mine);
    let before = buf.clone();
    comm.gather_in_place(&mut buf, root).unwrap();
    let want = if r == root { all.clone() } else { before };
    out.extend(wrong(&tag("gather in place"), &buf, &want));
    // Scatter: the root's buffer holds block k for rank k (rank k's values); others pass none.
    let send = if r == root { all.clone() } else { Vec::new() };
    let mut recv = poison::<T>(c);
    comm.scatter(&send, &mut recv, root).unwrap();
    out.extend(wrong(&tag("scatter"), &recv, &mine));
    let mut buf = if r == root {
        all.clone()
    } else {
        poison(n * c)
    };
    comm.scatter_in_place(&mut buf, root).unwrap();
    let mut want = if r == root {
        all.clone()
    } else {
        poison(n * c)
    };
    want[r * c..(r + 1) * c].copy_from_slice(&mine);
    out.extend(wrong(&tag("scatter in place"), &buf, &want));
    out
}

/// Counts with zeros that differ by rank.
fn counts(n: usize, salt: usize) -> Vec<usize> {
    (0..n).map(|k| [0, 3, 1, 700, 2][(k + salt) % 5]).collect()
}

/// Blocks in reverse rank order, two elements apart; the extent.
fn spread(c: &[usize]) -> (Vec<usize>, usize) {
    let mut d = vec![0; c.len()];
    let mut next = 2;
    for k in (0..c.len()).rev() {
        d[k] = next;
        next += c[k] + 2;
    }
    (d, next)
}

fn packed(c: &[usize]) -> Vec<usize> {
    (0..c.len()).map(|k| c[..k].iter().sum()).collect()
}

fn all_gather_v<T: CheckValue>(comm: &Communicator, salt: usize) -> Vec<String> {
    let (r, n) = (comm.rank(), comm.size());
    let cnt = counts(n, salt);
    let mine: Vec<T> = (0..cnt[r]).map(|i| val(r, i)).collect();
    let (displs, len) = spread(&cnt);
    let mut want = poison::<T>(len);
    for k in 0..n {
        for i in 0..cnt[k] {
            want[displs[k] + i] = val(k, i);
        }
    }
    let mut out = Vec::new();
    let mut recv = poison::<T>(len);
    comm.all_gather_v(&mine, &mut recv, &cnt, Some(&displs))
        .unwrap();
    out.extend(wrong(&format!("rank {r} allgatherv"), &recv, &want));
    // In place, packed.
    let p = packed(&cnt);
    let total: usize = cnt.iter().sum();
    let mut buf = poison::<T>(total);
    buf[p[r]..p[r] + cnt[r]].copy_from_slice(&mine);
    comm.all_gather_v_in_place(&mut buf, &cnt, None).unwrap();
    let want: Vec<T> = (0..n)
        .flat_map(|k| (0..cnt[k]).map(move |i| val::<T>(k, i)))
        .collect();
    out.extend(wrong(&format!("rank {r} allgatherv in place"), &buf, &want));
    out
}

fn reduce_scatter_v<T: CheckValue>(comm: &Communicator, salt: usize, op: ReduceOp) -> Vec<String> {
    let (r, n) = (comm.rank(), comm.size());
    let cnt = counts(n, salt);
    let total: usize = cnt.iter().sum();
    let p = packed(&cnt);
    let send: Vec<T> = (0..total).map(|j| val(r, j)).collect();
    let reduced = |j: usize| -> T {
        let vals = (0..n).map(|k| (k * 1000 + j % 1000) as i64 % 120);
        match op {
            ReduceOp::Sum => T::from_i64(vals.sum()),
            ReduceOp::Max => T::from_i64(vals.max().unwrap_or(0)),
            ReduceOp::Avg => T::avg(vals.sum(), n),
            _ => unreachable!(),
        }
    };
    let want: Vec<T> = (0..cnt[r]).map(|i| reduced(p[r] + i)).collect();
    let mut out = Vec::new();
    let mut recv = poison::<T>(cnt[r]);
    comm.reduce_scatter_v(&send, &mut recv, &cnt, op).unwrap();
    out.extend(wrong(
        &format!("rank {r} reducescatterv {op}"),
        &recv,
        &want,
    ));
    let mut buf = send.clone();
    comm.reduce_scatter_v_in_place(&mut buf, &cnt, op).unwrap();
    let mut want_buf = send;
    want_buf[p[r]..p[r] + cnt[r]].copy_from_slice(&want);
    out.extend(wrong(
        &format!("rank {r} reducescatterv in place {op}"),
        &buf,
        &want_buf,
    ));
    out
}

/// Elements rank `from` sends rank `to` (symmetric when `sym`, for the in-place form).
fn pair(from: usize, to: usize, salt: usize, sym: bool) -> usize {
    let k = if sym {
        (from + to) * 3 + from * to
    } else {
        from * 3 + to * 5
    };
    [0, 2, 5, 1, 600][(k + salt) % 5]
}

/// Value of element `i` of the block rank `from` sends rank `to`.
fn av<T: CheckValue>(from: usize, to: usize, i: usize) -> T {
    T::from_i64(((from * 7 + to * 13 + i) % 120) as i64)
}

fn all_to_all_v<T: CheckValue>(comm: &Communicator, salt: usize) -> Vec<String> {
    let (r, n) = (comm.rank(), comm.size());
    let mut out = Vec::new();
    for sym in [false, true] {
        let sc: Vec<usize> = (0..n).map(|k| pair(r, k, salt, sym)).collect();
        let rc: Vec<usize> = (0..n).map(|k| pair(k, r, salt, sym)).collect();
        // Send blocks spread out in reverse order, receive blocks packed (out of place).
        let (sd, slen) = spread(&sc);
        let mut send = poison::<T>(slen);
        for k in 0..n {
            for i in 0..sc[k] {
                send[sd[k] + i] = av(r, k, i);
            }
        }
        let want: Vec<T> = (0..n)
            .flat_map(|k| (0..rc[k]).map(move |i| av::<T>(k, r, i)))
            .collect();
        if !sym {
            let mut recv = poison::<T>(want.len());
            comm.all_to_all_v(&send, &sc, Some(&sd), &mut recv, &rc, None)
                .unwrap();
            out.extend(wrong(&format!("rank {r} alltoallv"), &recv, &want));
            // Non-blocking, through the general entry.
            let c = Counts::AllToAllV {
                send_counts: sc.clone(),
                send_displs: Some(sd.clone()),
                recv_counts: rc.clone(),
                recv_displs: None,
            };
            let (_, recv) = comm
                .collective_v_async::<T, _, _>(
                    c,
                    Some(send),
                    poison::<T>(want.len()),
                    ReduceOp::Sum,
                )
                .wait()
                .unwrap();
            out.extend(wrong(&format!("rank {r} alltoallv async"), &recv, &want));
        } else {
            // In place: one layout for both directions, blocks spread with gaps left alone.
            let (d, len) = spread(&rc);
            let mut buf = poison::<T>(len);
            for k in 0..n {
                for i in 0..rc[k] {
                    buf[d[k] + i] = av(r, k, i);
                }
            }
            comm.all_to_all_v_in_place(&mut buf, &rc, Some(&d)).unwrap();
            let mut want_buf = poison::<T>(len);
            for k in 0..n {
                for i in 0..rc[k] {
                    want_buf[d[k] + i] = av(k, r, i);
                }
            }
            out.extend(wrong(
                &format!("rank {r} alltoallv in place"),
                &buf,
                &want_buf,
            ));
        }
    }
    out
}

fn everything<T: CheckValue>(comm: &Communicator) -> Vec<String> {
    let n = comm.size();
    let mut out = Vec::new();
    let mut roots = vec![0, n - 1, n / 2];
    roots.dedup();
    for c in [0, 1, 7, 1023] {
        for &root in &roots {
            out.extend(rooted::<T>(comm, c, root));
        }
    }
    for salt in 0..3 {
        out.extend(all_gather_v::<T>(comm, salt));
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
            out.extend(reduce_scatter_v::<T>(comm, salt, op));
        }
        out.extend(all_to_all_v::<T>(comm, salt));
    }
    // The non-blocking gather goes through the same path as every collective.
    let r = comm.rank();
    let recv = if r == n - 1 {
        poison::<T>(n * 3)
    } else {
        Vec::new()
    };
    let mine: Vec<T> = (0..3).map(|i| val(r, i)).collect();
    let (_, recv) = comm
        .collective_async(
            oxccl::Collective::Gather,
            Some(mine),
            recv,
            ReduceOp::Sum,
            n - 1,
        )
        .wait()
        .unwrap();
    if r == n - 1 {
        let all: Vec<T> = (0..n * 3).map(|j| val(j / 3, j % 3)).collect();
        out.extend(wrong(&format!("rank {r} gather async"), &recv, &all));
    }
    out
}

fn sweep(t: TransportKind) {
    for n in 1..=5 {
        let bad = run_ranks(n, config(t, Duration::from_secs(60)), |comm| {
            let mut out = everything::<f32>(&comm);
            out.extend(everything::<i64>(&comm));
            out
        });
        let bad: Vec<String> = bad.into_iter().flatten().collect();
        assert!(bad.is_empty(), "{t:?} {n} ranks:\n{}", bad.join("\n"));
    }
}

#[test]
fn every_collective_over_local() {
    sweep(TransportKind::Local);
}

#[test]
fn every_collective_over_tcp() {
    sweep(TransportKind::Tcp);
}

/// Runs `f` on 3 ranks; every rank must fail (by the next barrier at the latest) well before the
/// timeout, with an error containing one of `needles`.
fn must_fail(
    t: TransportKind,
    needles: &'static [&'static str],
    f: impl Fn(&Communicator) -> oxccl::Result<()> + Send + Sync + Clone + 'static,
) {
    let errs = run_ranks(3, config(t, Duration::from_secs(20)), move |comm| {
        let t0 = Instant::now();
        let e = f(&comm)
            .and_then(|()| comm.barrier())
            .expect_err("disagreeing counts must fail");
        std::thread::sleep(Duration::from_millis(300));
        (comm.rank(), e.to_string(), t0.elapsed())
    });
    for (rank, e, took) in errs {
        assert!(
            needles.iter().any(|n| e.contains(n)),
            "{t:?} rank {rank}: {e} lacks one of {needles:?}"
        );
        assert!(took < Duration::from_secs(15), "rank {rank} took {took:?}");
    }
}

const MISMATCH: &[&str] = &["mismatched calls", "out of step", "failed"];

#[test]
fn counts_that_disagree_fail_fast() {
    for t in [TransportKind::Local, TransportKind::Tcp] {
        // Rank 2 thinks rank 1 contributes nothing: no data would move between them, so only
        // the handshake can tell.
        must_fail(t, MISMATCH, |c| {
            let cnt = if c.rank() == 2 { [2, 0, 2] } else { [2, 3, 2] };
            let mut recv = vec![0u32; cnt.iter().sum()];
            let mine = vec![1u32; cnt[c.rank()]];
            c.all_gather_v(&mine, &mut recv, &cnt, None)
        });
        // Every pair exchanges one element, but rank 0 thinks it sends rank 1 none (and, in a
        // second call, five).
        for wrong in [0, 5] {
            must_fail(t, MISMATCH, move |c| {
                let sc = if c.rank() == 0 {
                    [1, wrong, 1]
                } else {
                    [1, 1, 1]
                };
                let rc = [1, 1, 1];
                let mut recv = [0u8; 3];
                c.all_to_all_v(&vec![7u8; sc.iter().sum()], &sc, None, &mut recv, &rc, None)
            });
        }
        must_fail(t, MISMATCH, |c| {
            let cnt = if c.rank() == 0 { [1, 1, 1] } else { [1, 1, 2] };
            let mut recv = vec![0f64; cnt[c.rank()]];
            c.reduce_scatter_v(
                &vec![1f64; cnt.iter().sum()],
                &mut recv,
                &cnt,
                ReduceOp::Sum,
            )
        });
        // Gather with a count the root does not expect from one rank.
        must_fail(t, MISMATCH, |c| {
            let k = if c.rank() == 1 { 4 } else { 3 };
            let mut recv = vec![0i32; if c.rank() == 0 { 9 } else { 0 }];
            c.gather(&vec![1i32; k], &mut recv, 0)
        });
    }
}

#[test]
fn bad_arguments_are_named() {
    run_ranks(
        3,
        config(TransportKind::Local, Duration::from_secs(30)),
        |comm| {
            let r = comm.rank();
            let check = |e: oxccl::Error, needle: &str| {
                let s = e.to_string();
                assert!(s.contains(needle), "{s} lacks {needle}");
                assert!(
                    s.contains(&format!("rank {r}")),
                    "{s} does not name rank {r}"
                );
            };
            let mut b = vec![0f32; 9];
            check(
                comm.gather(&[1f32; 3], &mut b, 3).unwrap_err(),
                "root 3 is out of range for 3 ranks",
            );
            check(
                comm.scatter(&[1f32; 9], &mut b, 0).unwrap_err(),
                "needs a send buffer of 108 bytes, got 36",
            );
            check(
                comm.all_gather_v(&[1f32; 2], &mut b, &[2, 2], None)
                    .unwrap_err(),
                "allgatherv: receive counts has 2 entries for 3 ranks",
            );
            check(
                comm.all_gather_v(&[1f32; 1], &mut b, &[2, 2, 2], None)
                    .unwrap_err(),
                "need a send buffer of 8 bytes",
            );
            check(
                comm.all_gather_v(&[1f32; 2], &mut b, &[2, 2, 2], Some(&[0, 1, 4]))
                    .unwrap_err(),
                "overlap",
            );
            check(
                comm.all_to_all_v(&[1u8; 3], &[1, 1, 1], None, &mut [0u8; 2], &[1, 1, 1], None)
                    .unwrap_err(),
                "need a receive buffer of 3 bytes",
            );
            check(
                comm.reduce_scatter_v(&[1f32; 6], &mut [0f32; 2], &[2, 2, 2], ReduceOp::BAnd)
                    .unwrap_err(),
                "bitwise",
            );
            check(
                comm.collective(oxccl::Collective::AllToAllV, None, &mut b, ReduceOp::Sum, 0)
                    .unwrap_err(),
                "takes a count per rank",
            );
            // Argument errors leave the communicator usable.
            comm.barrier().unwrap();
        },
    );
}
