//! The thread that finishes what a sender's caller left, and reads what arrives for an
//! endpoint whose caller is away.

use super::*;

/// How often the keeper reads the planes of endpoints whose callers are away.
const IDLE_SWEEP: Duration = Duration::from_secs(1);

/// The thread that finishes senders' work while their callers are elsewhere.
pub(super) struct Keeper {
    endpoints: Mutex<KeeperList>,
    wake: Condvar,
}

#[derive(Default)]
pub(super) struct KeeperList {
    live: Vec<Weak<Mutex<Inner>>>,
    poked: bool,
}

pub(super) fn keeper() -> &'static Keeper {
    static K: OnceLock<&'static Keeper> = OnceLock::new();
    K.get_or_init(|| {
        let k: &'static Keeper = Box::leak(Box::new(Keeper {
            endpoints: Mutex::new(KeeperList::default()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("ccl-planes".into())
            .spawn(move || k.run())
            .expect("spawning the TCP planes keeper thread");
        k
    })
}

impl Keeper {
    pub(super) fn list(&self) -> std::sync::MutexGuard<'_, KeeperList> {
        self.endpoints.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn add(&self, ep: &Arc<Mutex<Inner>>) {
        self.list().live.push(Arc::downgrade(ep));
    }

    pub(super) fn poke(&self) {
        let mut l = self.list();
        if !l.poked {
            l.poked = true;
            self.wake.notify_one();
        }
    }

    pub(super) fn run(&self) {
        let mut swept = Instant::now();
        loop {
            let eps: Vec<Arc<Mutex<Inner>>> = {
                let mut l = self.list();
                l.live.retain(|w| w.strong_count() > 0);
                l.live.iter().filter_map(Weak::upgrade).collect()
            };
            let mut busy = false;
            let sweep = swept.elapsed() >= IDLE_SWEEP;
            if sweep {
                swept = Instant::now();
            }
            for ep in &eps {
                let Ok(mut g) = ep.try_lock() else {
                    busy = true;
                    continue;
                };
                // An endpoint whose caller has been away a while is read too: a peer closing
                // its end waits until it knows this end has read what it sent.
                if sweep && g.touched.elapsed() >= IDLE_SWEEP {
                    let _ = g.service(true);
                }
                if !g.has_work() {
                    continue;
                }
                busy = true;
                if g.touched.elapsed() < KEEPER_TICK {
                    continue;
                }
                // An error here (every plane failed) is the caller's to see on its next call,
                // where the same planes fail again; the keeper only stops working for it.
                let _ = g.service(true);
            }
            drop(eps);
            let mut l = self.list();
            if busy || l.poked {
                l.poked = false;
                drop(l);
                std::thread::sleep(KEEPER_TICK);
            } else {
                let _unused = self
                    .wake
                    .wait_timeout(l, IDLE_SWEEP)
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}
