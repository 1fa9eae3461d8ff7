//! The tree, halving-doubling and hierarchical allreduce, each forced through `CCL_ALGO`, with
//! ranks as threads: world sizes 1..=8, counts {0, 1, 7, 1023}, every dtype and op, in place and
//! out of place, over the in-process and TCP transports, with exact expected values. A topology
//! file describing 2 racks x 2 hosts x 2 ranks (the ranks of one process all report the same
//! host name, so the file places them on made-up hosts) drives the hierarchical path and the
//! topology-ordered ring and trees. The tree broadcast and reduce run from every root over the
//! same made-up hosts.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use ccl_core::config::TransportKind;
use common::*;
use oxccl::{Communicator, ErrorKind, ReduceOp, UniqueId};

const COUNTS: [usize; 4] = [0, 1, 7, 1023];

/// Writes a topology file for `n` ranks: rank `r` on host `r % hosts`, so hosts are not
/// contiguous in rank order, in 2 racks.
fn topo_file(tag: &str, n: usize, hosts: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ccl-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{tag}-{n}.txt"));
    let mut text = String::from("# rank host rack zone [link Gbit/s]\nrack-uplink 100\n");
    for r in 0..n {
        let h = r % hosts;
        text.push_str(&format!("{r} node{h} rack{} zone0 25\n", h % 2));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn sweep(transport: TransportKind, algo: &'static str, topo: Option<usize>) {
    // Software RDMA in a 2-vCPU VM: fewer world sizes, every size that changes a schedule's shape.
    let max = if transport == TransportKind::Ib { 5 } else { 8 };
    for n in 1..=max {
        let mut cfg = config(transport, Duration::from_secs(120));
        cfg.algo = Some(format!("allreduce:{algo}"));
        if let Some(hosts) = topo {
            cfg.topo_file = Some(
                topo_file(&format!("{algo}-{transport:?}"), n, hosts)
                    .display()
                    .to_string(),
            );
        }
        let results = run_ranks(n, cfg, move |comm| {
            let mut wrong = Vec::new();
            for count in COUNTS {
                for op in ReduceOp::ARITHMETIC {
                    for in_place in [false, true] {
                        for (dtype, w) in all_dtypes(&comm, count, op, in_place) {
                            if w > 0 {
                                wrong.push(format!(
                                    "rank {} count {count} {dtype} {op} in_place={in_place}: {w} wrong",
                                    comm.rank()
                                ));
                            }
                        }
                    }
                }
            }
            wrong
        });
        let wrong: Vec<String> = results.into_iter().flatten().collect();
        assert!(
            wrong.is_empty(),
            "{algo} over {transport:?}, {n} ranks, topology {topo:?}:\n{}",
            wrong.join("\n")
        );
    }
}

#[test]
fn tree_local() {
    sweep(TransportKind::Local, "tree", None);
}

#[test]
fn tree_tcp() {
    sweep(TransportKind::Tcp, "tree", None);
}

#[test]
fn halving_doubling_local() {
    sweep(TransportKind::Local, "hd", None);
}

#[test]
fn halving_doubling_tcp() {
    sweep(TransportKind::Tcp, "hd", None);
}

#[test]
fn hierarchical_local() {
    // All ranks on one host (no file), then 4 made-up hosts in 2 racks.
    sweep(TransportKind::Local, "hier", None);
    sweep(TransportKind::Local, "hier", Some(4));
}

#[test]
fn hierarchical_tcp() {
    sweep(TransportKind::Tcp, "hier", None);
    sweep(TransportKind::Tcp, "hier", Some(4));
}

/// Tree, halving-doubling and hierarchical allreduce over verbs, with and without a topology
/// file of made-up hosts.
#[cfg(feature = "ib")]
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_every_allreduce_algorithm() {
    require_ib();
    for algo in ["tree", "hd"] {
        sweep(TransportKind::Ib, algo, None);
    }
    sweep(TransportKind::Ib, "hier", Some(2));
}

#[test]
fn topology_ordered_ring_tree_and_hd() {
    for algo in ["ring", "tree", "hd"] {
        sweep(TransportKind::Local, algo, Some(3));
    }
}

/// Large buffers: many pipelined pieces per op (the in-flight hazards a small count never
/// reaches), 2 racks x 2 hosts x 2 ranks.
#[test]
fn large_counts_pipeline() {
    let count = (1 << 20) + 3;
    for algo in ["tree", "hd", "hier"] {
        for n in [3, 8] {
            let mut cfg = config(TransportKind::Tcp, Duration::from_secs(120));
            cfg.algo = Some(format!("allreduce:{algo}"));
            cfg.chunk_size = 64 << 10;
            cfg.topo_file = Some(topo_file("large", n, 4).display().to_string());
            let wrong: usize = run_ranks(n, cfg, move |comm| {
                let mut w = 0;
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    for in_place in [false, true] {
                        w += allreduce_case::<f32>(&comm, count, op, in_place);
                        w += allreduce_case::<i8>(&comm, count, op, in_place);
                    }
                }
                w
            })
            .into_iter()
            .sum();
            assert_eq!(wrong, 0, "{algo} n={n}");
        }
    }
}

/// Tree broadcast and reduce from every root, ranks placed by a topology file (the tree follows
/// its ring order), every dtype; reduce with every op; non-root buffers of reduce untouched.
#[test]
fn rooted_trees_every_root_with_a_topology() {
    use ccl_core::test_values::{self, CheckValue};
    use oxccl::Collective;
    fn one<T: CheckValue>(comm: &Communicator, c: usize, op: ReduceOp, in_place: bool) -> usize {
        let (r, n) = (comm.rank(), comm.size());
        let mine: Vec<T> = (0..c)
            .map(|i| T::from_i64(test_values::input(op, r, i)))
            .collect();
        let poison = || vec![T::from_i64(99); c];
        let same = |a: &T, b: &T| bytemuck::bytes_of(a) == bytemuck::bytes_of(b);
        let mut wrong = 0;
        for root in 0..n {
            // Broadcast: the root's input everywhere.
            let out = if in_place {
                let mut b = mine.clone();
                comm.broadcast_in_place(&mut b, root).unwrap();
                b
            } else {
                let mut b = poison();
                comm.broadcast(&mine, &mut b, root).unwrap();
                b
            };
            wrong += (0..c)
                .filter(|&i| !same(&out[i], &T::from_i64(test_values::input(op, root, i))))
                .count();
            // Reduce: the result at the root only.
            let out = if in_place {
                let mut b = mine.clone();
                comm.reduce_in_place(&mut b, op, root).unwrap();
                b
            } else {
                let mut b = poison();
                comm.reduce(&mine, &mut b, op, root).unwrap();
                b
            };
            wrong += (0..c)
                .filter(|&i| {
                    let want = if r == root {
                        test_values::expected::<T>(op, n, i)
                    } else if in_place {
                        mine[i]
                    } else {
                        T::from_i64(99)
                    };
                    !same(&out[i], &want)
                })
                .count();
        }
        wrong
    }
    for transport in [TransportKind::Local, TransportKind::Tcp] {
        for n in 1..=8 {
            let mut cfg = config(transport, Duration::from_secs(120));
            cfg.topo_file = Some(
                topo_file(&format!("rooted-{transport:?}"), n, 3)
                    .display()
                    .to_string(),
            );
            let wrong: Vec<String> = run_ranks(n, cfg, move |comm| {
                comm.set_algorithm(Collective::Broadcast, Some(oxccl::Algo::Tree))
                    .unwrap();
                comm.set_algorithm(Collective::Reduce, Some(oxccl::Algo::Tree))
                    .unwrap();
                let mut wrong = Vec::new();
                for c in COUNTS {
                    for op in ReduceOp::ARITHMETIC {
                        for in_place in [false, true] {
                            let w = one::<f32>(&comm, c, op, in_place)
                                + one::<half::bf16>(&comm, c, op, in_place)
                                + one::<i8>(&comm, c, op, in_place)
                                + one::<u64>(&comm, c, op, in_place);
                            if w > 0 {
                                wrong.push(format!(
                                    "rank {} count {c} {op} in_place={in_place}: {w} wrong",
                                    comm.rank()
                                ));
                            }
                        }
                    }
                }
                wrong
            })
            .into_iter()
            .flatten()
            .collect();
            assert!(
                wrong.is_empty(),
                "{transport:?} n={n}:\n{}",
                wrong.join("\n")
            );
        }
    }
}

/// A communicator split off one with a topology file keeps its members' places (the file names
/// the parent's ranks, so the child must not read it).
#[test]
fn split_keeps_the_topology() {
    for transport in [TransportKind::Local, TransportKind::Tcp] {
        let mut cfg = config(transport, Duration::from_secs(120));
        cfg.topo_file = Some(topo_file("split", 8, 4).display().to_string());
        cfg.algo = Some("allreduce:hier".into());
        let wrong: usize = run_ranks(8, cfg, |comm| {
            // Even ranks sit on hosts 0 and 2 (rack 0), odd ones on hosts 1 and 3 (rack 1).
            let r = comm.rank();
            let child = comm.split(Some((r % 2) as u32), r as i64).unwrap().unwrap();
            assert_eq!(child.size(), 4);
            let mut w = 0;
            for count in COUNTS {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    w += allreduce_case::<f32>(&child, count, op, false);
                    w += allreduce_case::<i32>(&child, count, op, true);
                }
            }
            w
        })
        .into_iter()
        .sum();
        assert_eq!(wrong, 0, "{transport:?}");
    }
}

fn init_all(n: usize, cfg: oxccl::Config) -> Vec<oxccl::Result<Communicator>> {
    let id = UniqueId::new_at(LOOPBACK, &cfg).expect("unique id");
    let hs: Vec<_> = (0..n)
        .map(|rank| {
            let (id, cfg) = (id.clone(), cfg.clone());
            std::thread::spawn(move || Communicator::init_with_config(&id, rank, n, cfg))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn bad_topology_file_is_an_invalid_argument_naming_file_and_line() {
    let dir = std::env::temp_dir().join(format!("ccl-topo-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("topo.txt");
    std::fs::write(&path, "0 a r z\n1 a r\n").unwrap();
    let mut cfg = config(TransportKind::Local, Duration::from_secs(20));
    cfg.topo_file = Some(path.display().to_string());
    for r in init_all(2, cfg.clone()) {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(
            e.to_string()
                .contains(&format!("{} line 2", path.display())),
            "{e}"
        );
    }
    // A rank the world does not have.
    std::fs::write(&path, "0 a r z\n1 a r z\n2 a r z\n").unwrap();
    for r in init_all(2, cfg) {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(
            e.to_string().contains("line 3: rank 2 does not exist"),
            "{e}"
        );
    }
}
