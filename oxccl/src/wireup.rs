//! Connecting a communicator's ranks: which transport each pair uses, and the connections.
//!
//! Every rank publishes one [`Record`]: where it runs ([`HostId`]) and a connection handle for
//! each transport it has, most preferred first. For each pair, the first transport in the lower
//! rank's list that the higher rank also has, and whose [`Scope`] includes the pair, wins (NCCL's
//! `selectTransport`): shared memory within a host, then verbs, then TCP when the ranks offer
//! those. Every rank computes the same answer from the same records.
//!
//! Then each rank connects to every higher rank, on the calling thread, while one thread per
//! transport accepts the lower ranks that chose it. Accepting on all transports at once is what
//! keeps the set-up from deadlocking: a rank that accepted one transport before another could
//! wait for a peer stuck connecting to a rank that waits for this one on the other transport.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ccl_bootstrap::wire;
use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::transport::{ConnectContext, Endpoint, Handle, Listener, Scope, Transport};

/// Where a rank runs, as far as sharing memory goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostId {
    /// The host name (`gethostname`).
    pub name: String,
    /// The kernel's boot id: two machines, or containers on two machines, that share a host name
    /// still differ here.
    pub boot_id: String,
    /// The network namespace (its inode): ranks in different namespaces cannot reach each
    /// other's Unix sockets, which set up shared memory.
    pub netns: u64,
    pub pid: u32,
}

impl HostId {
    /// This process's.
    pub(crate) fn current() -> HostId {
        use std::os::unix::fs::MetadataExt;
        HostId {
            name: ccl_core::log::hostname().to_string(),
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            netns: std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino()),
            pid: std::process::id(),
        }
    }

    /// Whether the two can share memory: same host name, same boot, same network namespace.
    pub(crate) fn shares_memory_with(&self, o: &HostId) -> bool {
        self.name == o.name
            && !self.boot_id.is_empty()
            && self.boot_id == o.boot_id
            && self.netns == o.netns
    }

    /// What two ranks that share memory have in common (`None`: unknown, shares with nobody).
    fn memory_key(&self) -> Option<(&str, &str, u64)> {
        (!self.boot_id.is_empty()).then_some((
            self.name.as_str(),
            self.boot_id.as_str(),
            self.netns,
        ))
    }

    fn in_scope(&self, o: &HostId, scope: Scope) -> bool {
        match scope {
            Scope::Any => true,
            Scope::Host => self.shares_memory_with(o),
            Scope::Process => self.shares_memory_with(o) && self.pid == o.pid,
        }
    }
}

/// What a rank tells the others before any connection is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    /// This rank's process runs the rendezvous root.
    pub runs_root: bool,
    /// Fingerprint of the topology file in use (0: none); all ranks must agree.
    pub topo_fp: u64,
    pub host: HostId,
    /// Transport name and connection handle, most preferred first.
    pub offers: Vec<(String, Handle)>,
}

/// Blobs before the offers: flag, fingerprint, host name, boot id, network namespace, pid.
const FIXED_BLOBS: usize = 6;

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut blobs = vec![
            vec![u8::from(self.runs_root)],
            self.topo_fp.to_le_bytes().to_vec(),
            self.host.name.as_bytes().to_vec(),
            self.host.boot_id.as_bytes().to_vec(),
            self.host.netns.to_le_bytes().to_vec(),
            self.host.pid.to_le_bytes().to_vec(),
        ];
        for (name, h) in &self.offers {
            blobs.push(name.as_bytes().to_vec());
            blobs.push(h.as_bytes().to_vec());
        }
        wire::encode_blobs(&blobs)
    }

    /// Decodes rank `from`'s record; anything malformed is an error naming it.
    pub(crate) fn decode(b: &[u8], from: usize) -> Result<Record> {
        let bad = || Error::remote(format!("malformed set-up record from rank {from}")).peer(from);
        let blobs = wire::blob_slices(b).map_err(|_| bad())?;
        if blobs.len() < FIXED_BLOBS || (blobs.len() - FIXED_BLOBS) % 2 != 0 {
            return Err(bad());
        }
        let text = |v: &[u8]| std::str::from_utf8(v).map(str::to_owned).map_err(|_| bad());
        let u64_of = |v: &[u8]| v.try_into().map(u64::from_le_bytes).map_err(|_| bad());
        let offers = blobs[FIXED_BLOBS..]
            .chunks(2)
            .map(|p| Ok((text(p[0])?, Handle::new(p[1]).map_err(|_| bad())?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Record {
            runs_root: blobs[0] == [1],
            topo_fp: u64_of(blobs[1])?,
            host: HostId {
                name: text(blobs[2])?,
                boot_id: text(blobs[3])?,
                netns: u64_of(blobs[4])?,
                pid: blobs[5]
                    .try_into()
                    .map(u32::from_le_bytes)
                    .map_err(|_| bad())?,
            },
            offers,
        })
    }

    fn offers(&self, name: &str) -> Option<&Handle> {
        self.offers.iter().find(|(n, _)| n == name).map(|(_, h)| h)
    }

    fn names(&self) -> String {
        let n: Vec<&str> = self.offers.iter().map(|(n, _)| n.as_str()).collect();
        if n.is_empty() {
            "nothing".into()
        } else {
            n.join(", ")
        }
    }
}

/// The index in `mine` of the transport ranks `lo` < `hi` use: the first in `lo`'s list that
/// `hi` also offers and that can connect them.
fn pick(lo: &Record, hi: &Record, mine: &[Arc<dyn Transport>]) -> Option<usize> {
    lo.offers.iter().find_map(|(name, _)| {
        let t = mine.iter().position(|t| t.name() == name)?;
        (hi.offers(name).is_some() && lo.host.in_scope(&hi.host, mine[t].scope())).then_some(t)
    })
}

/// For every peer of `rank`, the index in `mine` (this rank's transports) of the transport the
/// pair uses (`None` for `rank` itself).
pub(crate) fn choose(
    rank: usize,
    records: &[Record],
    mine: &[Arc<dyn Transport>],
) -> Result<Vec<Option<usize>>> {
    (0..records.len())
        .map(|peer| {
            if peer == rank {
                return Ok(None);
            }
            let (lo, hi) = (&records[rank.min(peer)], &records[rank.max(peer)]);
            pick(lo, hi, mine).map(Some).ok_or_else(|| {
                Error::invalid_usage(format!(
                    "ranks {} and {} have no transport in common that can connect them (rank {} \
                     on {} has {}; rank {} on {} has {}); set CCL_TRANSPORT alike on every rank, \
                     and use shm only when every rank is on one host",
                    rank.min(peer),
                    rank.max(peer),
                    rank.min(peer),
                    lo.host.name,
                    lo.names(),
                    rank.max(peer),
                    hi.host.name,
                    hi.names()
                ))
                .rank(rank)
                .peer(peer)
            })
        })
        .collect()
}

/// Ranks that any transport choice treats alike: the same offers in the same order, the same
/// memory host and, when a transport connects only threads of one process, the same process.
/// `class[r]` numbers rank `r`'s kind; `members[c]` are kind `c`'s ranks in order. A job has a
/// few kinds per host, so pair questions can be asked of kinds instead of ranks.
struct Kinds {
    class: Vec<usize>,
    members: Vec<Vec<usize>>,
    /// Each kind's memory host (`None`: unknown, so every rank of it is a host of its own).
    memory: Vec<Option<usize>>,
}

impl Kinds {
    fn new(records: &[Record], mine: &[Arc<dyn Transport>]) -> Kinds {
        use std::collections::HashMap;
        let by_process = mine.iter().any(|t| t.scope() == Scope::Process);
        let mut hosts: HashMap<(&str, &str, u64), usize> = HashMap::new();
        // (memory host, the rank itself when that is unknown, offers, process) -> kind
        type Key<'a> = (Option<usize>, usize, Vec<&'a str>, u32);
        let mut kinds: HashMap<Key<'_>, usize> = HashMap::new();
        let (mut class, mut members, mut memory) =
            (Vec::new(), Vec::<Vec<usize>>::new(), Vec::new());
        for (r, rec) in records.iter().enumerate() {
            let m = rec.host.memory_key().map(|k| {
                let next = hosts.len();
                *hosts.entry(k).or_insert(next)
            });
            let key = (
                m,
                // A rank whose memory host is unknown is alike only to itself.
                if m.is_none() { r } else { 0 },
                rec.offers.iter().map(|(n, _)| n.as_str()).collect(),
                if by_process { rec.host.pid } else { 0 },
            );
            let next = members.len();
            let c = *kinds.entry(key).or_insert(next);
            if c == next {
                members.push(Vec::new());
                memory.push(m);
            }
            members[c].push(r);
            class.push(c);
        }
        Kinds {
            class,
            members,
            memory,
        }
    }
}

/// The lowest and highest of `ranks` that `keep` keeps.
fn span(ranks: &[usize], keep: impl Fn(usize) -> bool) -> Option<(usize, usize)> {
    let lo = ranks.iter().copied().find(|&r| keep(r))?;
    let hi = ranks.iter().rev().copied().find(|&r| keep(r))?;
    Some((lo, hi))
}

/// Whether the ranks of every host share host memory: on each host of more than one rank
/// (`groups`: each host's ranks, as the topology places them), every pair uses a transport that
/// sets up host memory (`TransportProperties::host_memory`) and none of them uses it with a rank
/// elsewhere, so the segment the transport makes holds exactly the host's ranks; and at least
/// one host has more than one rank. Every rank computes the same answer from the same records,
/// so all agree on whether the algorithms that need it can run.
pub(crate) fn hosts_share_memory(
    records: &[Record],
    mine: &[Arc<dyn Transport>],
    groups: &[Vec<usize>],
) -> bool {
    // Asked pair by pair this is N^2 transport choices per group; asked of kinds of ranks
    // (`Kinds`) it is a few per host. A segment across hosts is not a thing: every host-memory
    // transport connects only ranks that share memory, so pairs from two memory hosts never
    // use one, and only a group's own memory hosts need looking at.
    if mine
        .iter()
        .any(|t| t.properties().host_memory && t.scope() == Scope::Any)
    {
        return false;
    }
    let kinds = Kinds::new(records, mine);
    let mut group_of = vec![usize::MAX; records.len()];
    for (i, g) in groups.iter().enumerate() {
        for &r in g {
            group_of[r] = i;
        }
    }
    let mut same_host: std::collections::HashMap<usize, Vec<usize>> = Default::default();
    for (c, m) in kinds.memory.iter().enumerate() {
        if let Some(m) = m {
            same_host.entry(*m).or_default().push(c);
        }
    }
    let host_memory = |lo: usize, hi: usize| {
        let rep = |c: usize| &records[kinds.members[c][0]];
        pick(rep(lo), rep(hi), mine).map(|t| mine[t].properties().host_memory)
    };
    let mut any = false;
    for (gi, g) in groups.iter().enumerate().filter(|(_, g)| g.len() > 1) {
        let mut here: Vec<usize> = g.iter().map(|&r| kinds.class[r]).collect();
        here.sort_unstable();
        here.dedup();
        let inside: Vec<(usize, usize, usize)> = here
            .iter()
            .filter_map(|&c| span(&kinds.members[c], |r| group_of[r] == gi).map(|(a, b)| (c, a, b)))
            .collect();
        let outside = |c: usize| span(&kinds.members[c], |r| group_of[r] != gi);
        for &(c1, min1, max1) in &inside {
            // Every pair inside the group uses host memory: for kinds c1, c2, the pairs with
            // the lower rank of c1 exist when c1's lowest rank is below c2's highest.
            for &(c2, _, max2) in &inside {
                if min1 < max2 && host_memory(c1, c2) != Some(true) {
                    return false;
                }
            }
            // No pair with a rank outside it does.
            let Some(m) = kinds.memory[c1] else { continue };
            for &c2 in &same_host[&m] {
                let Some((min2, max2)) = outside(c2) else {
                    continue;
                };
                if (min1 < max2 && host_memory(c1, c2) != Some(false))
                    || (min2 < max1 && host_memory(c2, c1) != Some(false))
                {
                    return false;
                }
            }
        }
        any = true;
    }
    any
}

/// One line on what connects to what, e.g. `2 hosts x 2 ranks: shm within hosts, tcp across`.
pub(crate) fn summary(
    records: &[Record],
    rank: usize,
    chosen: &[Option<usize>],
    mine: &[Arc<dyn Transport>],
) -> String {
    // Ranks per memory host; a rank whose host is unknown is a host of its own.
    let mut per: std::collections::HashMap<(&str, &str, u64), usize> = Default::default();
    let mut alone = 0;
    for r in records {
        match r.host.memory_key() {
            Some(k) => *per.entry(k).or_default() += 1,
            None => alone += 1,
        }
    }
    let hosts = per.len() + alone;
    let sizes = per.values().copied().chain((alone > 0).then_some(1));
    let (lo, hi) = sizes.fold((usize::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
    let lo = lo.min(hi);
    let shape = if lo == hi {
        format!("{hosts} host{} x {lo} rank{}", plural(hosts), plural(lo))
    } else {
        format!("{hosts} hosts x {lo}-{hi} ranks")
    };
    let mut within: Vec<&str> = Vec::new();
    let mut across: Vec<&str> = Vec::new();
    for (peer, c) in chosen.iter().enumerate() {
        let Some(t) = c else { continue };
        let name = mine[*t].name();
        let list = if records[rank].host.shares_memory_with(&records[peer].host) {
            &mut within
        } else {
            &mut across
        };
        if !list.contains(&name) {
            list.push(name);
        }
    }
    let mut parts = Vec::new();
    if !within.is_empty() {
        parts.push(format!("{} within hosts", within.join("+")));
    }
    if !across.is_empty() {
        parts.push(format!("{} across", across.join("+")));
    }
    if parts.is_empty() {
        shape
    } else {
        format!("{shape}: {} (as seen from rank {rank})", parts.join(", "))
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// How long one accept call waits before it looks whether set-up was called off.
const ACCEPT_SLICE: Duration = Duration::from_millis(100);

/// Fails when the set-up should stop: another rank failed or died meanwhile. Called with the
/// ranks the caller still waits for.
pub(crate) type Watch<'a> = &'a (dyn Fn(&[usize]) -> Result<()> + Sync);

/// Prepares every transport with the peers it will connect this rank to, then has the ranks of
/// each host that share memory join it ([`Transport::join_host`]), before any pair connects.
/// `chosen[p]` is the transport of the pair with `p` (in `mine`); `records` give the leaders'
/// handles; `watch` is asked between waits whether another rank's failure ends the set-up.
pub(crate) fn prepare_all(
    ctx: &ConnectContext,
    mine: &[Arc<dyn Transport>],
    chosen: &[Option<usize>],
    records: &[Record],
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<()> {
    let rank = ctx.rank;
    for (t, transport) in mine.iter().enumerate() {
        let peers: Vec<usize> = (0..records.len())
            .filter(|&p| chosen[p] == Some(t))
            .collect();
        if peers.is_empty() {
            continue;
        }
        transport.prepare(ctx, &peers).map_err(|e| e.rank(rank))?;
        let mut group = peers;
        group.push(rank);
        group.sort_unstable();
        let leader = group[0];
        let handle = records[leader].offers(transport.name()).ok_or_else(|| {
            Error::internal(format!(
                "rank {leader} published no {} handle",
                transport.name()
            ))
            .rank(rank)
        })?;
        transport
            .join_host(ctx, &group, handle, deadline, watch)
            .map_err(|e| e.rank(rank))?;
    }
    Ok(())
}

/// Connects to every higher rank and accepts every lower one, each pair over its chosen
/// transport (pairs with none, `None` in `chosen`, are left alone). `listeners[t]` listens for `mine[t]`; `records` give the peers' handles; `watch`
/// is asked between waits whether another rank's failure ends the set-up.
pub(crate) fn connect_all(
    ctx: &ConnectContext,
    mine: &[Arc<dyn Transport>],
    listeners: Vec<Option<Box<dyn Listener>>>,
    chosen: &[Option<usize>],
    records: &[Record],
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<Vec<Option<Box<dyn Endpoint>>>> {
    let rank = ctx.rank;
    let cancel = AtomicBool::new(false);
    let mut endpoints: Vec<Option<Box<dyn Endpoint>>> = (0..records.len()).map(|_| None).collect();
    let accepted = std::thread::scope(|s| {
        let threads: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .filter_map(|(t, l)| {
                let from: Vec<usize> = (0..rank).filter(|&p| chosen[p] == Some(t)).collect();
                let mut l = l?;
                if from.is_empty() {
                    return None;
                }
                let cancel = &cancel;
                let name = mine[t].name();
                Some(s.spawn(move || {
                    accept_from(&mut *l, name, rank, &from, deadline, cancel, watch)
                }))
            })
            .collect();
        let connected = connect_up(ctx, mine, chosen, records, deadline, &mut endpoints, watch);
        if connected.is_err() {
            cancel.store(true, Ordering::Relaxed);
        }
        let mut accepted = Vec::new();
        let mut first_err = connected.err();
        for th in threads {
            match th.join() {
                Ok(Ok(eps)) => accepted.extend(eps),
                Ok(Err(e)) => {
                    cancel.store(true, Ordering::Relaxed);
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(Error::internal("a set-up thread panicked").rank(rank));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(accepted),
        }
    })?;
    for (peer, ep) in accepted {
        endpoints[peer] = Some(ep);
    }
    Ok(endpoints)
}

fn connect_up(
    ctx: &ConnectContext,
    mine: &[Arc<dyn Transport>],
    chosen: &[Option<usize>],
    records: &[Record],
    deadline: Instant,
    endpoints: &mut [Option<Box<dyn Endpoint>>],
    watch: Watch<'_>,
) -> Result<()> {
    let rank = ctx.rank;
    for peer in rank + 1..records.len() {
        // A pair without a transport here connects later, on demand.
        let Some(t) = chosen[peer] else { continue };
        watch(&[peer])?;
        let t = &mine[t];
        let handle = records[peer].offers(t.name()).ok_or_else(|| {
            Error::internal(format!("peer {peer} published no {} handle", t.name())).rank(rank)
        })?;
        let ep = t.connect(ctx, peer, handle, deadline).map_err(|e| {
            e.rank(rank)
                .peer(peer)
                .context(format!("connecting to peer {peer} over {}", t.name()))
        })?;
        endpoints[peer] = Some(ep);
    }
    Ok(())
}

/// Accepts one connection from each rank in `from` on `l`.
fn accept_from(
    l: &mut dyn Listener,
    name: &str,
    rank: usize,
    from: &[usize],
    deadline: Instant,
    cancel: &AtomicBool,
    watch: Watch<'_>,
) -> Result<Vec<(usize, Box<dyn Endpoint>)>> {
    let mut got: Vec<(usize, Box<dyn Endpoint>)> = Vec::with_capacity(from.len());
    while got.len() < from.len() {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::internal("set-up called off").rank(rank));
        }
        let missing: Vec<usize> = from
            .iter()
            .copied()
            .filter(|p| !got.iter().any(|(q, _)| q == p))
            .collect();
        watch(&missing)?;
        let slice = deadline.min(Instant::now() + ACCEPT_SLICE);
        match l.accept(slice) {
            Ok((peer, ep)) => {
                if !from.contains(&peer) || got.iter().any(|(p, _)| *p == peer) {
                    return Err(Error::remote(format!(
                        "unexpected {name} connection claiming rank {peer}"
                    ))
                    .rank(rank)
                    .peer(peer));
                }
                got.push((peer, ep));
            }
            Err(e) if e.kind() == ErrorKind::Timeout && Instant::now() < deadline => {}
            Err(e) => {
                let missing: Vec<String> = missing.iter().map(|p| p.to_string()).collect();
                return Err(e.rank(rank).context(format!(
                    "waiting for rank(s) {} to connect over {name}",
                    missing.join(", ")
                )));
            }
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests;
