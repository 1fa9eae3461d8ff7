use super::*;
use ccl_core::topology::Topology;

fn host(name: &str, netns: u64, pid: u32) -> HostId {
    HostId {
        name: name.into(),
        boot_id: "b00t".into(),
        netns,
        pid,
    }
}

fn rec(h: HostId, offers: &[&str]) -> Record {
    Record {
        runs_root: false,
        topo_fp: 0,
        host: h,
        offers: offers
            .iter()
            .map(|n| (n.to_string(), Handle::new(n.as_bytes()).unwrap()))
            .collect(),
    }
}

#[derive(Debug)]
struct Fake(&'static str, Scope);
impl Transport for Fake {
    fn name(&self) -> &'static str {
        self.0
    }
    fn scope(&self) -> Scope {
        self.1
    }
    fn properties(&self) -> ccl_core::transport::TransportProperties {
        ccl_core::transport::TransportProperties {
            latency: Duration::ZERO,
            bandwidth: 1.0,
            spin: Duration::ZERO,
            host_memory: self.0 == "shm",
        }
    }
    fn listen(&self, _: &ConnectContext) -> Result<Box<dyn Listener>> {
        unreachable!()
    }
    fn connect(
        &self,
        _: &ConnectContext,
        _: usize,
        _: &Handle,
        _: Instant,
    ) -> Result<Box<dyn Endpoint>> {
        unreachable!()
    }
}

fn mine() -> Vec<Arc<dyn Transport>> {
    vec![
        Arc::new(Fake("shm", Scope::Host)),
        Arc::new(Fake("ib", Scope::Any)),
        Arc::new(Fake("tcp", Scope::Any)),
    ]
}

/// Host memory on every host only when each host's ranks, as the topology groups them,
/// are exactly the ranks that share memory pair by pair.
#[test]
fn every_host_shares_memory_only_when_each_hosts_ranks_do() {
    let all = ["shm", "tcp"];
    let two_by_two = vec![
        rec(host("a", 1, 10), &all),
        rec(host("a", 1, 11), &all),
        rec(host("b", 1, 20), &all),
        rec(host("b", 1, 21), &all),
    ];
    let hosts = vec![vec![0, 1], vec![2, 3]];
    assert!(hosts_share_memory(&two_by_two, &mine(), &hosts));
    // A rank alone on its host needs no memory; the others still share theirs.
    let mut lone = two_by_two.clone();
    lone.push(rec(host("c", 1, 30), &all));
    assert!(hosts_share_memory(
        &lone,
        &mine(),
        &[vec![0, 1], vec![2, 3], vec![4]]
    ));
    // A rank with shared memory off: its host has none, so not every host does.
    let mut off = two_by_two.clone();
    off[3] = rec(host("b", 1, 21), &["tcp"]);
    assert!(!hosts_share_memory(&off, &mine(), &hosts));
    // A topology that puts the four on one host, or three of them: the segments would not
    // hold the topology's hosts.
    assert!(!hosts_share_memory(
        &two_by_two,
        &mine(),
        &[vec![0, 1, 2, 3]]
    ));
    assert!(!hosts_share_memory(
        &two_by_two,
        &mine(),
        &[vec![0, 1, 2], vec![3]]
    ));
    // One that splits a pair into two hosts of one rank each: those need no host memory
    // (their shared-memory connection is only a pipe to them), the other host has its own.
    assert!(hosts_share_memory(
        &two_by_two,
        &mine(),
        &[vec![0], vec![1], vec![2, 3]]
    ));
    // A rank per host: no host memory anywhere.
    let spread: Vec<Record> = (0..3)
        .map(|i| rec(host(&format!("h{i}"), 1, 10 + i), &all))
        .collect();
    assert!(!hosts_share_memory(
        &spread,
        &mine(),
        &[vec![0], vec![1], vec![2]]
    ));
}

/// The definitions, pair by pair (N^2 choices per group): what the fast versions must
/// agree with.
fn hosts_share_memory_by_pairs(
    records: &[Record],
    mine: &[Arc<dyn Transport>],
    groups: &[Vec<usize>],
) -> bool {
    let mut any = false;
    for g in groups.iter().filter(|g| g.len() > 1) {
        for &a in g {
            let chosen = choose(a, records, mine).unwrap();
            for (b, t) in chosen.iter().enumerate() {
                if let Some(t) = t
                    && g.contains(&b) != mine[*t].properties().host_memory
                {
                    return false;
                }
            }
        }
        any = true;
    }
    any
}

fn hosts_by_pairs(records: &[Record]) -> (usize, usize, usize) {
    let mut hosts: Vec<&HostId> = Vec::new();
    for r in records {
        if !hosts.iter().any(|h| h.shares_memory_with(&r.host)) {
            hosts.push(&r.host);
        }
    }
    let per: Vec<usize> = hosts
        .iter()
        .map(|h| {
            records
                .iter()
                .filter(|r| r.host.shares_memory_with(h) || std::ptr::eq(&r.host, *h))
                .count()
        })
        .collect();
    let lo = per.iter().min().copied().unwrap_or(0);
    (hosts.len(), lo, per.iter().max().copied().unwrap_or(0))
}

/// Random jobs: hosts, namespaces, unknown boots, ranks with different transport lists
/// (tcp always among them, so that every pair can connect), threads of shared processes,
/// and topologies that group by host or cut hosts apart.
#[test]
fn the_fast_host_checks_agree_with_the_pair_by_pair_definitions() {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n) as usize
    };
    let lists: [&[&str]; 5] = [
        &["shm", "tcp"],
        &["shm", "ib", "tcp"],
        &["tcp"],
        &["ib", "tcp", "shm"],
        &["local", "shm", "tcp"],
    ];
    let with_local = {
        let mut m = mine();
        m.insert(0, Arc::new(Fake("local", Scope::Process)));
        m
    };
    let (mut agreed_true, mut agreed_false) = (0, 0);
    for case in 0..3000 {
        let n = 1 + next(12);
        let mixed = case % 3 == 0;
        let threads = case % 5 == 0;
        let records: Vec<Record> = (0..n)
            .map(|r| {
                let h = next(3);
                let mut id = host(&format!("h{h}"), 1 + (next(8) == 0) as u64, r as u32);
                if threads {
                    id.pid = next(2) as u32;
                }
                if next(20) == 0 {
                    id.boot_id.clear();
                }
                let list = if mixed {
                    lists[next(5)]
                } else {
                    lists[case % 2]
                };
                rec(id, list)
            })
            .collect();
        let groups: Vec<Vec<usize>> = if next(2) == 0 {
            let t = Topology::from_hosts(
                &records
                    .iter()
                    .map(|r| r.host.name.clone())
                    .collect::<Vec<_>>(),
            );
            t.host_groups()
        } else {
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                order.swap(i, next(i as u64 + 1));
            }
            let mut gs: Vec<Vec<usize>> = vec![Vec::new()];
            for r in order {
                if !gs.last().unwrap().is_empty() && next(3) == 0 {
                    gs.push(Vec::new());
                }
                gs.last_mut().unwrap().push(r);
            }
            gs
        };
        let m = if threads { with_local.clone() } else { mine() };
        let want = hosts_share_memory_by_pairs(&records, &m, &groups);
        assert_eq!(
            hosts_share_memory(&records, &m, &groups),
            want,
            "case {case}: {records:?} in {groups:?}"
        );
        if want {
            agreed_true += 1;
        } else {
            agreed_false += 1;
        }
        let (h, lo, hi) = hosts_by_pairs(&records);
        let s = summary(&records, 0, &choose(0, &records, &m).unwrap(), &m);
        let shape = if lo == hi {
            format!("{h} host{} x {lo} rank{}", plural(h), plural(lo))
        } else {
            format!("{h} hosts x {lo}-{hi} ranks")
        };
        assert!(s.starts_with(&shape), "case {case}: {s} against {shape}");
    }
    // Both answers came up often enough for the agreement to mean something.
    assert!(
        agreed_true > 200 && agreed_false > 200,
        "{agreed_true} {agreed_false}"
    );
}

#[test]
fn records_round_trip_and_garbage_is_refused() {
    let r = rec(host("a", 7, 9), &["shm", "tcp"]);
    assert_eq!(Record::decode(&r.encode(), 3).unwrap(), r);
    let e = Record::decode(b"\x01\x00\x00\x00", 3).unwrap_err();
    assert!(e.to_string().contains("rank 3"), "{e}");
    let b = r.encode();
    for n in 0..b.len() {
        let _ = Record::decode(&b[..n], 1);
    }
}

/// Two hosts of two ranks: shared memory within each, the network across; a rank with
/// shared memory off talks to its neighbour over the network; containers on one host in two
/// network namespaces do not share memory.
#[test]
fn each_pair_takes_the_first_transport_that_can_connect_it() {
    let all = ["shm", "tcp"];
    let recs = vec![
        rec(host("a", 1, 10), &all),
        rec(host("a", 1, 11), &all),
        rec(host("b", 1, 20), &all),
        rec(host("b", 1, 21), &["tcp"]),
    ];
    let names = |rank| -> Vec<&str> {
        choose(rank, &recs, &mine())
            .unwrap()
            .iter()
            .map(|c| c.map_or("-", |t| mine()[t].name()))
            .collect()
    };
    assert_eq!(names(0), ["-", "shm", "tcp", "tcp"]);
    assert_eq!(names(1), ["shm", "-", "tcp", "tcp"]);
    assert_eq!(names(2), ["tcp", "tcp", "-", "tcp"]);
    assert_eq!(names(3), ["tcp", "tcp", "tcp", "-"]);
    let s = summary(&recs, 0, &choose(0, &recs, &mine()).unwrap(), &mine());
    assert!(
        s.starts_with("2 hosts x 2 ranks: shm within hosts, tcp across"),
        "{s}"
    );

    let containers = vec![rec(host("a", 1, 10), &all), rec(host("a", 2, 10), &all)];
    let c = choose(0, &containers, &mine()).unwrap();
    assert_eq!(mine()[c[1].unwrap()].name(), "tcp");
    let mut other_boot = containers.clone();
    other_boot[1].host.netns = 1;
    other_boot[1].host.boot_id = "other".into();
    assert_eq!(
        mine()[choose(0, &other_boot, &mine()).unwrap()[1].unwrap()].name(),
        "tcp"
    );
}

#[test]
fn no_common_transport_names_both_ranks_and_what_they_have() {
    let recs = vec![
        rec(host("a", 1, 1), &["shm"]),
        rec(host("b", 1, 2), &["shm"]),
    ];
    let e = choose(1, &recs, &mine()).unwrap_err();
    let s = e.to_string();
    assert_eq!(e.kind(), ErrorKind::InvalidUsage);
    assert!(
        s.contains("ranks 0 and 1") && s.contains("on a has shm") && s.contains("on b has shm"),
        "{s}"
    );
}
