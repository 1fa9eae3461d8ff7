//! Rendezvous from the environment, as launchers set it.
//!
//! Rank and size come from the first launcher whose variables are present, in this order:
//!
//! | launcher | rank | size | local rank |
//! |---|---|---|---|
//! | ccl | `CCL_RANK` | `CCL_WORLD_SIZE` | `CCL_LOCAL_RANK` |
//! | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
//! | Open MPI | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
//! | MPICH (Hydra) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` |
//! | Slurm | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
//!
//! The rendezvous point, in order: `CCL_UNIQUE_ID` (an id made elsewhere, whose root is already
//! running); `CCL_COMM_ID=host:port` or `MASTER_ADDR`+`MASTER_PORT` (rank 0 starts the root on that
//! port; under torchrun, whose agent already holds `MASTER_PORT`, the default is `MASTER_PORT+1`,
//! and `CCL_BOOTSTRAP_PORT` overrides); else, when every rank is on this host, a file in the temp
//! directory named after the job, through which rank 0 hands the others a fresh unique id.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::rank::{Bootstrap, check_rank};
use super::root::Root;
use crate::LOG_SUBSYS;
use crate::id::{UniqueId, random_secret};
use crate::timing::{JOIN_ATTEMPT_MAX, JOIN_ATTEMPT_MIN};
use ccl_core::ccl_info;
use ccl_core::config::Config;
use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::hash::Fnv1a;
use ccl_core::net;

/// Where ranks meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// A unique id whose root already runs.
    Id(UniqueId),
    /// Rank 0 starts a root on `port` of `host`; the others connect there.
    Address {
        host: String,
        port: u16,
        secret: [u8; 32],
    },
    /// Single host: rank 0 writes a unique id to `path`, the others read it.
    File { path: PathBuf },
}

/// This process's place in the job, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub rank: usize,
    pub size: usize,
    pub local_rank: Option<usize>,
    /// Which launcher's variables were used (`ccl`, `torchrun`, `openmpi`, `hydra`, `slurm`).
    pub launcher: &'static str,
    pub rendezvous: Rendezvous,
}

struct Source {
    name: &'static str,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    /// Ranks on this host, when the launcher says.
    local_size: &'static str,
}

/// The library's own variables; their values are parsed by [`Config`].
const CCL_SOURCE: Source = Source {
    name: "ccl",
    rank: "CCL_RANK",
    size: "CCL_WORLD_SIZE",
    local_rank: "CCL_LOCAL_RANK",
    local_size: "CCL_LOCAL_SIZE",
};

/// Launchers, in order of precedence after the library's own variables.
const SOURCES: &[Source] = &[
    Source {
        name: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: "LOCAL_WORLD_SIZE",
    },
    Source {
        name: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
    },
    Source {
        name: "hydra",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: "MPI_LOCALNRANKS",
    },
    Source {
        name: "slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: "SLURM_NTASKS_PER_NODE",
    },
];

fn num(lookup: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<Option<usize>> {
    match lookup(var).filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
            Error::invalid_argument(format!("{var}='{v}' is not a valid non-negative integer"))
        }),
    }
}

impl Launch {
    /// Reads the process environment.
    pub fn from_env(cfg: &Config) -> Result<Launch> {
        Launch::from_lookup(cfg, &|k| std::env::var(k).ok())
    }

    /// Reads variables through `lookup` (tests pass a map). `cfg` supplies the `CCL_*` settings.
    pub fn from_lookup(cfg: &Config, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Launch> {
        match (cfg.rank, cfg.world_size) {
            (Some(rank), Some(size)) => {
                let src = &CCL_SOURCE;
                check_rank(rank, size)
                    .map_err(|e| e.context("from CCL_RANK and CCL_WORLD_SIZE"))?;
                let rendezvous = rendezvous(cfg, lookup, src, size, cfg.local_size)?;
                return Ok(Launch {
                    rank,
                    size,
                    local_rank: cfg.local_rank,
                    launcher: src.name,
                    rendezvous,
                });
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::invalid_argument(
                    "CCL_RANK and CCL_WORLD_SIZE must be set together",
                ));
            }
            (None, None) => {}
        }
        let mut found = None;
        for s in SOURCES {
            let (r, n) = (num(lookup, s.rank)?, num(lookup, s.size)?);
            match (r, n) {
                (Some(r), Some(n)) => {
                    found = Some((s, r, n));
                    break;
                }
                (Some(_), None) => {
                    return Err(Error::invalid_argument(format!(
                        "{} is set but {} is not ({} launcher variables are incomplete)",
                        s.rank, s.size, s.name
                    )));
                }
                (None, Some(_)) if s.name != "slurm" => {
                    // SLURM_NTASKS is also set inside an allocation outside `srun`; elsewhere a
                    // lone size variable is a mistake.
                    return Err(Error::invalid_argument(format!(
                        "{} is set but {} is not ({} launcher variables are incomplete)",
                        s.size, s.rank, s.name
                    )));
                }
                _ => {}
            }
        }
        let Some((src, rank, size)) = found else {
            return Err(Error::invalid_argument(
                "no rank in the environment: set CCL_RANK and CCL_WORLD_SIZE, or run under torchrun (RANK, WORLD_SIZE), mpirun (OMPI_COMM_WORLD_*, PMI_*) or srun (SLURM_PROCID, SLURM_NTASKS)",
            ));
        };
        check_rank(rank, size)
            .map_err(|e| e.context(format!("from {} and {}", src.rank, src.size)))?;
        let local_rank = num(lookup, src.local_rank)?;
        let local_size = num(lookup, src.local_size)?;
        let rendezvous = rendezvous(cfg, lookup, src, size, local_size)?;
        Ok(Launch {
            rank,
            size,
            local_rank,
            launcher: src.name,
            rendezvous,
        })
    }

    /// Joins the rendezvous: starts the root first when this is rank 0 of an address or file
    /// rendezvous.
    pub fn bootstrap(&self, cfg: &Config) -> Result<Bootstrap> {
        let (rank, size) = (self.rank, self.size);
        match &self.rendezvous {
            Rendezvous::Id(id) => Bootstrap::connect(id, rank, size, cfg.timeout),
            Rendezvous::Address { host, port, secret } => {
                let addr = resolve(host, *port).map_err(|e| e.rank(rank))?;
                if rank == 0 {
                    let wildcard = if addr.is_ipv4() {
                        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
                    } else {
                        IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                    };
                    Root::listen_and_spawn(SocketAddr::new(wildcard, *port), *secret, cfg.timeout)
                        .map_err(|e| e.rank(rank))?;
                    ccl_info!(
                        Some(rank),
                        "bootstrap: root listening on port {port} ({} launcher)",
                        self.launcher
                    );
                }
                let id = UniqueId::for_address(addr, *secret);
                Bootstrap::connect(&id, rank, size, cfg.timeout)
            }
            Rendezvous::File { path } => file_rendezvous(path, rank, size, cfg),
        }
    }
}

fn rendezvous(
    cfg: &Config,
    lookup: &dyn Fn(&str) -> Option<String>,
    src: &Source,
    size: usize,
    local_size: Option<usize>,
) -> Result<Rendezvous> {
    if let Some(hex) = &cfg.unique_id {
        return Ok(Rendezvous::Id(
            UniqueId::from_hex(hex).map_err(|e| e.context("CCL_UNIQUE_ID"))?,
        ));
    }
    let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
    let (host, port, what) = if let Some(c) = &cfg.comm_id {
        let (h, p) = split_host_port(c).ok_or_else(|| {
            Error::invalid_argument(format!(
                "CCL_COMM_ID='{c}' is not host:port (IPv6 as [addr]:port)"
            ))
        })?;
        (h, p, format!("CCL_COMM_ID={c}"))
    } else if let Some(h) = get("MASTER_ADDR") {
        let mp = get("MASTER_PORT")
            .ok_or_else(|| Error::invalid_argument("MASTER_ADDR is set but MASTER_PORT is not"))?;
        let mp: u16 = mp.trim().parse().map_err(|_| {
            Error::invalid_argument(format!("MASTER_PORT='{mp}' is not a port number"))
        })?;
        let agent =
            get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let port = match cfg.bootstrap_port {
            Some(p) => p,
            None if agent => mp.checked_add(1).ok_or_else(|| {
                Error::invalid_argument(
                    "MASTER_PORT=65535 leaves no port for the bootstrap; set CCL_BOOTSTRAP_PORT",
                )
            })?,
            None => mp,
        };
        (h.trim().to_string(), port, format!("MASTER_ADDR={h}"))
    } else {
        // No address: fine when the whole job is on this host.
        let single_host = size == 1
            || local_size == Some(size)
            || (src.name == "slurm"
                && get("SLURM_NNODES")
                    .or_else(|| get("SLURM_JOB_NUM_NODES"))
                    .as_deref()
                    == Some("1"));
        if !single_host {
            return Err(Error::invalid_argument(format!(
                "no rendezvous address: set MASTER_ADDR and MASTER_PORT, CCL_COMM_ID=host:port or CCL_UNIQUE_ID ({} launcher, {size} ranks not known to share this host)",
                src.name
            )));
        }
        let key = job_key(lookup);
        let dir = cfg
            .bootstrap_dir
            .clone()
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        return Ok(Rendezvous::File {
            path: dir.join(format!("ccl-rendezvous-{key}.id")),
        });
    };
    if port == 0 {
        return Err(Error::invalid_argument(format!(
            "{what}: port 0 is not a rendezvous port"
        )));
    }
    let secret = match &cfg.secret {
        Some(s) => expand_secret(s.as_bytes()),
        None => {
            // Without CCL_SECRET, derive one from what every rank of this job sees alike. It keeps
            // out strays from other jobs, not someone who can read this job's environment.
            let mut seed = format!("ccl-env|{host}|{port}|{size}");
            for k in [
                "TORCHELASTIC_RUN_ID",
                "SLURM_JOB_ID",
                "SLURM_STEP_ID",
                "OMPI_MCA_ess_base_jobid",
                "PMIX_NAMESPACE",
            ] {
                if let Some(v) = get(k) {
                    seed.push('|');
                    seed.push_str(&v);
                }
            }
            expand_secret(seed.as_bytes())
        }
    };
    Ok(Rendezvous::Address { host, port, secret })
}

/// A name for this job that all its ranks on this host share.
fn job_key(lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
    let raw = get("OMPI_MCA_ess_base_jobid")
        .or_else(|| get("PMIX_NAMESPACE"))
        .or_else(|| {
            get("SLURM_JOB_ID").map(|j| format!("{j}.{}", get("SLURM_STEP_ID").unwrap_or_default()))
        })
        .or_else(|| get("TORCHELASTIC_RUN_ID"))
        // Ranks started by one launcher process (mpirun, a Hydra proxy) share their parent.
        .unwrap_or_else(|| format!("ppid{}", std::os::unix::process::parent_id()));
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(96)
        .collect()
}

/// Stretches a string into 32 secret bytes (FNV-1a lanes; this is an identifier check, not a
/// cryptographic key derivation).
pub fn expand_secret(s: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (lane, chunk) in out.chunks_mut(8).enumerate() {
        let seed = (lane as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let h = Fnv1a::seeded(seed).bytes(s).finish();
        chunk.copy_from_slice(&h.to_le_bytes());
    }
    out
}

fn split_host_port(s: &str) -> Option<(String, u16)> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        return Some((h.to_string(), p.parse().ok()?));
    }
    let (h, p) = s.rsplit_once(':')?;
    if h.is_empty() || h.contains(':') {
        return None;
    }
    Some((h.to_string(), p.parse().ok()?))
}

/// Numeric addresses are used as they are; a host name (which the user chose to give) is looked
/// up once.
fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| {
            Error::io(
                ErrorKind::InvalidArgument,
                format!("cannot resolve rendezvous host '{host}'"),
                e,
            )
        })?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| {
            Error::invalid_argument(format!("rendezvous host '{host}' has no IPv4 address"))
        })
}

fn file_rendezvous(path: &PathBuf, rank: usize, size: usize, cfg: &Config) -> Result<Bootstrap> {
    let deadline = Instant::now() + cfg.timeout;
    if rank == 0 {
        let ip = match &cfg.socket_ifname {
            Some(spec) => net::pick_local_ip(Some(spec))?,
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        };
        let id = UniqueId::new_at(ip, cfg)?;
        write_private(path, &id.to_hex()).map_err(|e| e.rank(rank))?;
        ccl_info!(
            Some(rank),
            "bootstrap: single-host rendezvous through {}",
            path.display()
        );
        let b = Bootstrap::connect(&id, rank, size, cfg.timeout);
        // Every rank has joined (or the attempt failed): the file has done its job.
        let _ = std::fs::remove_file(path);
        return b;
    }
    // A file left by an earlier job with the same key names a dead root; retry with what the
    // file says now until the deadline.
    let mut last_err = None;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(id) = UniqueId::from_hex(&text)
        {
            let left = deadline.saturating_duration_since(Instant::now());
            match Bootstrap::connect(
                &id,
                rank,
                size,
                left.min(JOIN_ATTEMPT_MAX.get()).max(JOIN_ATTEMPT_MIN.get()),
            ) {
                Ok(b) => return Ok(b),
                Err(e) if e.kind() == ErrorKind::Timeout => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        if Instant::now() >= deadline {
            let why = last_err
                .map(|e| format!(" (last attempt: {e})"))
                .unwrap_or_default();
            return Err(Error::timeout(format!(
                "bootstrap: rank 0 did not publish a rendezvous in {} within {:?}{why}",
                path.display(),
                cfg.timeout
            ))
            .rank(rank));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `text` so that readers never see a partial file and other users cannot read it.
fn write_private(path: &PathBuf, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let err = |e| {
        Error::io(
            ErrorKind::System,
            format!("bootstrap: writing {}", path.display()),
            e,
        )
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)
}

/// A fresh secret for callers that start their own root.
pub fn new_secret() -> Result<[u8; 32]> {
    random_secret()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn launch(vars: &[(&str, &str)]) -> Result<Launch> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cfg = Config::from_lookup(|k| m.get(k).cloned())?;
        Launch::from_lookup(&cfg, &|k| m.get(k).cloned())
    }

    #[test]
    fn torchrun_variables() {
        let l = launch(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(
            (l.rank, l.size, l.local_rank, l.launcher),
            (3, 4, Some(1), "torchrun")
        );
        match l.rendezvous {
            Rendezvous::Address { host, port, .. } => {
                assert_eq!((host.as_str(), port), ("127.0.0.1", 29500))
            }
            r => panic!("{r:?}"),
        }
        // Under torchrun's agent store the port above MASTER_PORT is used; CCL_BOOTSTRAP_PORT wins.
        let l = launch(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap();
        assert!(matches!(
            l.rendezvous,
            Rendezvous::Address { port: 29501, .. }
        ));
        let l = launch(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("CCL_BOOTSTRAP_PORT", "31000"),
        ])
        .unwrap();
        assert!(matches!(
            l.rendezvous,
            Rendezvous::Address { port: 31000, .. }
        ));
    }

    #[test]
    fn precedence_and_other_launchers() {
        let l = launch(&[
            ("CCL_RANK", "1"),
            ("CCL_WORLD_SIZE", "2"),
            ("RANK", "5"),
            ("WORLD_SIZE", "9"),
            ("CCL_COMM_ID", "127.0.0.1:4000"),
        ])
        .unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (1, 2, "ccl"));
        let l = launch(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "1234"),
        ])
        .unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (2, 4, "openmpi"));
        match l.rendezvous {
            Rendezvous::File { path } => {
                assert!(path.to_string_lossy().ends_with("ccl-rendezvous-1234.id"))
            }
            r => panic!("{r:?}"),
        }
        let l = launch(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_NNODES", "1"),
            ("SLURM_JOB_ID", "77"),
        ])
        .unwrap();
        assert_eq!(l.launcher, "slurm");
        let l = launch(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALNRANKS", "2"),
        ])
        .unwrap();
        assert_eq!(l.launcher, "hydra");
    }

    #[test]
    fn bad_environments_are_named() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("RANK", "0"), ("WORLD_SIZE", "abc")], "WORLD_SIZE='abc'"),
            (&[("RANK", "0")], "WORLD_SIZE is not"),
            (&[("WORLD_SIZE", "2")], "RANK is not"),
            (
                &[
                    ("RANK", "4"),
                    ("WORLD_SIZE", "4"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", "1"),
                ],
                "rank 4 is out of range",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                ],
                "MASTER_PORT is not",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", "http"),
                ],
                "MASTER_PORT='http'",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2")],
                "no rendezvous address",
            ),
            (
                &[
                    ("CCL_RANK", "0"),
                    ("CCL_WORLD_SIZE", "2"),
                    ("CCL_COMM_ID", "nocolon"),
                ],
                "CCL_COMM_ID='nocolon'",
            ),
            (
                &[
                    ("CCL_RANK", "0"),
                    ("CCL_WORLD_SIZE", "1"),
                    ("CCL_UNIQUE_ID", "abcd"),
                ],
                "CCL_UNIQUE_ID",
            ),
            (&[], "no rank in the environment"),
        ];
        for (vars, needle) in cases {
            let e = launch(vars).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{vars:?}");
            assert!(e.to_string().contains(needle), "{e} lacks {needle}");
        }
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(
            split_host_port("10.0.0.1:99"),
            Some(("10.0.0.1".into(), 99))
        );
        assert_eq!(split_host_port("[fd00::1]:7"), Some(("fd00::1".into(), 7)));
        assert_eq!(split_host_port("fd00::1:7"), None);
        assert_eq!(split_host_port(":7"), None);
        assert_eq!(split_host_port("h:99999"), None);
    }

    #[test]
    fn secrets_depend_on_every_byte() {
        assert_ne!(expand_secret(b"job-a"), expand_secret(b"job-b"));
        assert_eq!(expand_secret(b"x"), expand_secret(b"x"));
    }

    #[test]
    fn env_rendezvous_over_an_address_and_a_file() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("ccl-env-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for mode in ["address", "file"] {
            let n = 3;
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let (dir, mode) = (dir.clone(), mode);
                    std::thread::spawn(move || {
                        let mut vars = vec![
                            ("CCL_RANK".to_string(), r.to_string()),
                            ("CCL_WORLD_SIZE".to_string(), n.to_string()),
                            ("CCL_TIMEOUT".to_string(), "20".to_string()),
                        ];
                        if mode == "address" {
                            vars.push(("MASTER_ADDR".into(), "127.0.0.1".into()));
                            vars.push(("MASTER_PORT".into(), port.to_string()));
                        } else {
                            vars.push(("CCL_LOCAL_SIZE".into(), n.to_string()));
                            vars.push((
                                "CCL_BOOTSTRAP_DIR".into(),
                                dir.to_string_lossy().into_owned(),
                            ));
                            vars.push((
                                "OMPI_MCA_ess_base_jobid".into(),
                                format!("t{}", std::process::id()),
                            ));
                        }
                        let m: HashMap<_, _> = vars.into_iter().collect();
                        let cfg = Config::from_lookup(|k| m.get(k).cloned()).unwrap();
                        let l = Launch::from_lookup(&cfg, &|k| m.get(k).cloned()).unwrap();
                        let mut b = l.bootstrap(&cfg).unwrap();
                        let all = b.allgather(&[r as u8]).unwrap();
                        b.finish().unwrap();
                        all
                    })
                })
                .collect();
            for h in hs {
                assert_eq!(h.join().unwrap(), vec![vec![0], vec![1], vec![2]], "{mode}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
