use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Bootstrap, Monitor, UniqueId};
use ccl_core::config::Config;
use ccl_diag::verdict::{self as diag, Presence, RankView};

/// `n` ranks of one job (threads of this process) with monitors of fan-out `f`, each
/// answering state queries, with the ranks that asked each to connect.
type Asked = std::sync::Arc<Mutex<Vec<usize>>>;

fn job(n: usize, f: usize) -> (UniqueId, Vec<Monitor>, Vec<Asked>) {
    job_with(
        n,
        f,
        std::sync::Arc::new(|r| diag::encode(&RankView::absent(r, "test", 1, Presence::Answered))),
    )
}

/// Each rank's state source.
type States = std::sync::Arc<dyn Fn(usize) -> Vec<u8> + Send + Sync>;

/// [`job`], with each rank `r` describing itself as `state(r)`.
fn job_with(n: usize, f: usize, state: States) -> (UniqueId, Vec<Monitor>, Vec<Asked>) {
    job_opts(n, f, state, None)
}

/// With `remote`, the root counts as running in a process of its own, with those ranks.
fn job_opts(
    n: usize,
    f: usize,
    state: States,
    remote: Option<Vec<usize>>,
) -> (UniqueId, Vec<Monitor>, Vec<Asked>) {
    let c = Config {
        timeout: Duration::from_secs(20),
        ..Config::default()
    };
    let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
    if let Some(with_root) = remote {
        super::hooks::set_remote(id.secret(), with_root);
    }
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let id = id.clone();
            std::thread::spawn(move || {
                let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                b.allgather(&[r as u8]).unwrap();
                b.into_monitor(f).unwrap()
            })
        })
        .collect();
    let mut asked = Vec::new();
    let ms: Vec<Monitor> = hs
        .into_iter()
        .enumerate()
        .map(|(r, h)| {
            let m = h.join().unwrap();
            let state = std::sync::Arc::clone(&state);
            m.set_state_source(Box::new(move || state(r)));
            let a = std::sync::Arc::new(Mutex::new(Vec::new()));
            let a2 = std::sync::Arc::clone(&a);
            m.set_connect_hook(Box::new(move |from| a2.lock().unwrap().push(from)));
            asked.push(a);
            m
        })
        .collect();
    (id, ms, asked)
}

fn until(what: &str, mut ok: impl FnMut() -> bool) {
    let by = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < by, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn report(id: &UniqueId) -> String {
    crate::live_query(id.root_addr(), &id.secret(), Duration::from_secs(10)).unwrap()
}

/// Every monitor of `ms` shrinks at once (`exclude` nothing) and commits: the members.
fn shrink_all(ms: &[&Monitor], n: usize) -> Vec<Vec<usize>> {
    let by = Instant::now() + Duration::from_secs(30);
    std::thread::scope(|sc| {
        let hs: Vec<_> = ms
            .iter()
            .map(|m| {
                sc.spawn(move || {
                    loop {
                        let d = m.shrink(&[], n, by).unwrap();
                        if m.formed(true, by).unwrap() {
                            return d.members;
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The monitor a standby took over gathers states and names the culprit of a later hang
/// as the first root did (here through what was a tree of hubs).
#[test]
fn after_a_takeover_the_monitor_names_the_culprit_of_a_hang() {
    // Rank 4 is stopped: it says nothing.
    let state = |r| {
        if r == 4 {
            Vec::new()
        } else {
            ring_view(r, 6, 0, 0)
        }
    };
    let (id, ms, _) = job_opts(6, 2, std::sync::Arc::new(state), Some(Vec::new()));
    until("every rank knows the standbys", || {
        ms.iter().all(|m| m.standby().is_some())
    });
    super::hooks::kill(id.secret(), id.root_addr());
    until("every rank follows rank 0's monitor", || {
        ms.iter().all(|m| m.moved_to() == Some(0))
    });
    let v = verdict_after_report(&ms, 5);
    assert!(
        v.starts_with("allreduce #5 (ring, 64 B) is stuck behind rank 4 ("),
        "{v}"
    );
    assert!(v.contains("which does not answer"), "{v}");
}

#[test]
fn the_roots_process_ending_after_its_rank_left_names_nobody_dead() {
    // As at the end of a job launched torchrun-style: rank 0, in the root's process,
    // destroys its communicator, then its process (and the root) ends.
    let state: States =
        std::sync::Arc::new(|r| diag::encode(&RankView::absent(r, "test", 1, Presence::Answered)));
    let (id, mut ms, _) = job_opts(3, 64, state, Some(vec![0]));
    until("every rank knows the standbys", || {
        ms.iter().all(|m| m.standby().is_some())
    });
    let sb = ms[0].standby().unwrap();
    assert_eq!(sb.ranks.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(sb.with_root, [0]);
    // Dropping waits until the root has told the others that rank 0 left.
    drop(ms.remove(0));
    assert!(ms.iter().all(|m| m.standby().unwrap().left == [0]));
    super::hooks::kill(id.secret(), id.root_addr());
    until("the others follow rank 1's monitor", || {
        ms.iter().all(|m| m.moved_to() == Some(1))
    });
    for m in &ms {
        assert_eq!(m.wait(Duration::from_millis(1500)), None);
        assert!(m.failed_ranks().is_empty());
    }
}

#[test]
fn a_standby_takes_the_monitor_over_when_the_root_dies_twice() {
    // Five ranks with fan-out 2: ranks 0 and 2 are hubs, rank 4 is below rank 0 and
    // below rank 2... the takeover makes the tree a star.
    let n = 5;
    let state: States =
        std::sync::Arc::new(|r| diag::encode(&RankView::absent(r, "test", 1, Presence::Answered)));
    let (id, mut ms, _) = job_opts(n, 2, state, Some(Vec::new()));
    until("every rank knows the standbys", || {
        ms.iter().all(|m| m.standby().is_some())
    });
    let sb = ms[0].standby().unwrap();
    assert_eq!(
        sb.ranks.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    assert!(sb.with_root.is_empty());

    super::hooks::kill(id.secret(), id.root_addr());
    until("every rank follows rank 0's monitor", || {
        ms.iter().all(|m| m.moved_to() == Some(0))
    });
    assert!(ms.iter().all(|m| !m.root_gone() && m.hub().is_none()));
    let refs: Vec<&Monitor> = ms.iter().collect();
    for members in shrink_all(&refs, n) {
        assert_eq!(members, vec![0, 1, 2, 3, 4]);
    }

    // Now rank 0's process dies, with the monitor it took over.
    super::hooks::kill(id.secret(), ms[0].root());
    ms.remove(0).vanish();
    until("the survivors follow rank 1's monitor", || {
        ms.iter().all(|m| m.moved_to() == Some(1))
    });
    for m in &ms {
        let n0 = m
            .wait(Duration::from_secs(20))
            .expect("a notice of rank 0's death");
        assert_eq!(n0.rank, 0, "{n0:?}");
        assert!(n0.died);
        assert_eq!(m.failed_ranks(), vec![0]);
    }
    let refs: Vec<&Monitor> = ms.iter().collect();
    for members in shrink_all(&refs, n) {
        assert_eq!(members, vec![1, 2, 3, 4]);
    }
}

/// 13 ranks with fan-out 3 make three levels: 0 and 9 report to the root; 3 and 6 to 0,
/// 12 to 9; 4 and 5 to 3, and so on. Frames cross every level both ways, a dead hub's
/// ranks join the root and stay watched, and deaths are named however a rank reported.
#[test]
fn a_tree_of_hubs_watches_the_job_and_survives_a_hub() {
    let (id, mut ms, asked) = job(13, 3);
    let hub_of = |r: usize| match r {
        0 | 9 => None,
        1..=3 | 6 => Some(0),
        12 => Some(9),
        r => Some(r - r % 3),
    };
    until("every rank reports through its hub", || {
        (0..13).all(|r| ms[r].hub() == hub_of(r))
    });
    // A state query reaches every rank through the tree and every answer comes back.
    let text = report(&id);
    assert!(!text.contains("does not answer"), "{text}");
    // Up two levels and down two: rank 8 (under 6, under 0) asks rank 10 (under 9).
    ms[8].ask_connect(10);
    until("rank 10 is asked by rank 8", || {
        asked[10].lock().unwrap().contains(&8)
    });
    // A rank's failure reaches every other rank.
    ms[11].report("rank 11 broke", None);
    for (r, m) in ms.iter().enumerate().filter(|(r, _)| *r != 11) {
        let n = m.wait(Duration::from_secs(30)).expect("a notice");
        assert_eq!(n.rank, 11, "rank {r}: {n:?}");
        assert!(!n.died);
    }
    // Hub 3 dies: it is named, and ranks 4 and 5 go on reporting to the root directly.
    let hub = ms.remove(3);
    hub.vanish();
    until("ranks 4 and 5 join the root", || {
        ms[3].hub().is_none() && ms[4].hub().is_none()
    });
    until("rank 3's death is named", || {
        report(&id).contains("rank 3") && report(&id).contains("its process ended")
    });
    let text = report(&id);
    assert!(!text.contains("does not answer"), "{text}");
    // Rank 4, now on its own line to the root, dies: named to the others too.
    let four = ms.remove(3);
    four.vanish();
    until("rank 4's death is named", || {
        ms[3].failed_ranks().contains(&4)
    });
    // Rank 5 still hears rank 1 (under hub 0), and rank 1 hears rank 5.
    ms[1].ask_connect(5);
    until("rank 5 is asked by rank 1", || {
        asked[5].lock().unwrap().contains(&1)
    });
    ms[3].ask_connect(2);
    until("rank 2 is asked by rank 5", || {
        asked[2].lock().unwrap().contains(&5)
    });
}

/// A goodbye through a hub is no death; the ranks below a hub that leaves join the root.
#[test]
fn a_hub_that_leaves_hands_its_ranks_to_the_root() {
    let (id, mut ms, _) = job(9, 2);
    // Fan-out 2, 9 ranks: rank 4 is the hub of 5 (and of 6, the hub of 7).
    until("rank 5 reports through rank 4", || ms[5].hub() == Some(4));
    let four = ms.remove(4);
    drop(four);
    // Rank 5 and rank 6 (now at indices 4 and 5) join the root; 7 stays under 6.
    until("ranks 5 and 6 join the root", || {
        ms[4].hub().is_none() && ms[5].hub().is_none()
    });
    assert_eq!(ms[6].hub(), Some(6));
    // Every rank answers the root's gathering once it is on its new line: a gathering on a
    // loaded host may miss one that is only slow (1 s), so ask until one hears everyone; a
    // rank the handover lost would never answer.
    until("a report hears every rank", || {
        !report(&id).contains("does not answer")
    });
    // A goodbye is no death: nobody hears of a failure.
    std::thread::sleep(Duration::from_millis(300));
    for m in &ms {
        assert!(m.poll().is_none(), "{:?}", m.poll());
    }
}

/// The state of rank `r` of `n` in a ring stuck in allreduce #5: each waits for the rank
/// before it, whose header arrived; `sent` is what it handed the link to the rank after it,
/// `got` what it received from the one before.
fn ring_view(r: usize, n: usize, sent: u64, got: u64) -> Vec<u8> {
    use ccl_diag::recorder::{PeerStat, State, now_us};
    let now = now_us();
    let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
    let stat = |peer, sent, received| PeerStat {
        peer,
        to_send: 64,
        sent,
        to_recv: 64,
        received,
        arrived: true,
        waited_us: 0,
        late_us: 0,
    };
    diag::encode(&RankView {
        rank: r,
        host: "test".into(),
        pid: 100 + r as u32,
        presence: Presence::Answered,
        now_us: now,
        ops: vec![ccl_diag::Op {
            seq: 5,
            name: "allreduce".into(),
            algo: "ring".into(),
            dtype: "float".into(),
            op: "sum".into(),
            count: 16,
            bytes: 64,
            root: None,
            state: State::Running,
            start_us: now - 10_000_000,
            end_us: 0,
            progress_us: now - 5_000_000,
            waiting_on: Some(prev),
            error: None,
            peers: vec![stat(prev, 0, got), stat(next, sent, 0)],
        }],
        slow: Vec::new(),
    })
}

/// The verdict every other rank gets once `reporter` reports a failure.
fn verdict_after_report(ms: &[Monitor], reporter: usize) -> String {
    ms[reporter].report("timed out", None);
    let verdicts: Vec<String> = ms
        .iter()
        .enumerate()
        .filter(|(r, _)| *r != reporter)
        .map(|(r, m)| {
            m.wait(Duration::from_secs(30))
                .unwrap_or_else(|| panic!("rank {r}: no notice"))
                .verdict
        })
        .collect();
    assert!(verdicts.iter().all(|v| *v == verdicts[0]), "{verdicts:?}");
    verdicts[0].clone()
}

/// Waits until every rank of `ms` (a job of fan-out `f`) reports through its hub: a query
/// sent while a rank moves reaches it, but its answer may miss the hub's.
fn settled(ms: &[Monitor], f: usize) {
    let tree = super::tree::Tree::new(ms.len(), f);
    until("every rank reports through its hub", || {
        ms.iter()
            .enumerate()
            .all(|(r, m)| m.hub() == tree.parent(r))
    });
}

/// With the monitor a tree, the verdict comes from digests merged hub by hub: a silent
/// rank two hubs below the root is found at the end of the ring's waits.
#[test]
fn a_tree_names_a_silent_rank_below_two_hubs() {
    // Rank 7 is stopped: it says nothing.
    let state = |r| {
        if r == 7 {
            Vec::new()
        } else {
            ring_view(r, 13, 0, 0)
        }
    };
    let (_id, ms, _) = job_with(13, 3, std::sync::Arc::new(state));
    settled(&ms, 3);
    let v = verdict_after_report(&ms, 8);
    assert!(
        v.starts_with("allreduce #5 (ring, 64 B) is stuck behind rank 7 ("),
        "{v}"
    );
    assert!(v.contains("which does not answer"), "{v}");
    assert!(
        v.contains("ranks 0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11 and 12 wait on it"),
        "{v}"
    );
}

/// A rank at the end of every wait whose own failure report names another rank failed
/// because of that rank (it saw it leave): the notice blames the rank it named. Here rank
/// 1 failed and says it waits for nobody (as a rank that has exited says nothing), so the
/// ring's waits all end at it; its report names rank 0.
#[test]
fn a_culprit_whose_report_names_another_rank_passes_the_blame_on() {
    use ccl_diag::recorder::State;
    let state = |r| {
        let mut v = diag::decode(&ring_view(r, 4, 0, 0)).unwrap();
        if r == 1 {
            v.ops[0].state = State::Failed;
            v.ops[0].waiting_on = None;
        }
        diag::encode(&v)
    };
    let (_id, ms, _) = job_with(4, 4, std::sync::Arc::new(state));
    ms[1].report("shared-memory peer 0 left", Some(0));
    for r in [0, 2, 3] {
        let n = ms[r].wait(Duration::from_secs(30)).expect("a notice");
        assert_eq!(n.rank, 1, "rank {r}: {n:?}");
        assert!(n.verdict.contains("stuck behind rank 1"), "rank {r}: {n:?}");
        assert_eq!(n.culprit, Some(0), "rank {r}: {n:?}");
    }
}

/// A link whose ends report through different top-level hubs: the root finds it from the
/// waiter's digest and both ends' views.
#[test]
fn a_tree_names_a_link_between_subtrees() {
    // Rank 8 handed 64 bytes to rank 9's link, and 16 arrived.
    let state = |r| match r {
        8 => ring_view(r, 13, 64, 0),
        9 => ring_view(r, 13, 0, 16),
        _ => ring_view(r, 13, 0, 0),
    };
    let (_id, ms, _) = job_with(13, 3, std::sync::Arc::new(state));
    settled(&ms, 3);
    let v = verdict_after_report(&ms, 9);
    assert!(
        v.starts_with("allreduce #5 (ring, 64 B) is stuck on the link from rank 8 (test:108) to rank 9 (test:109): 64 bytes were sent on it and 16 arrived, both ranks are inside the operation"),
        "{v}"
    );
}

/// What one verdict brings the root, star against tree: every rank's view against one
/// digest per top-level hub (and the views of the culprit). `CCL_VERDICT_RANKS` sets the
/// size (64 by default; docs/scale.md gives 1,024).
#[test]
fn a_tree_brings_the_root_digests_not_every_view() {
    let n: usize = std::env::var("CCL_VERDICT_RANKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut bytes = Vec::new();
    for f in [n, (n as f64).sqrt().ceil() as usize] {
        let silent = n / 2 + 1;
        let state = move |r| {
            if r == silent {
                Vec::new()
            } else {
                ring_view(r, n, 0, 0)
            }
        };
        let (id, ms, _) = job_with(n, f, std::sync::Arc::new(state));
        let tree = super::tree::Tree::new(n, f);
        until("every rank reports through its hub", || {
            ms.iter()
                .enumerate()
                .all(|(r, m)| m.hub() == tree.parent(r))
        });
        let before = crate::state_bytes(id.root_addr());
        let v = verdict_after_report(&ms, 0);
        let took = crate::state_bytes(id.root_addr()) - before;
        assert!(v.contains(&format!("stuck behind rank {silent} (")), "{v}");
        eprintln!("{n} ranks, fan-out {f}: the root took {took} bytes of state for the verdict");
        bytes.push(took);
        drop(ms);
    }
    assert!(bytes[1] * 4 < bytes[0], "{bytes:?}");
}
