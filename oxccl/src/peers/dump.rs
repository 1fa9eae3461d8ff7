//! The flight recorder's dumps: on a failure, on `SIGUSR1`, and on the first failure notice
//! while this rank is outside ccl.

use super::*;

/// Communicators that dump their recorder on `SIGUSR1`.
pub(super) fn dumpers() -> &'static Mutex<Vec<std::sync::Weak<Peers>>> {
    static D: std::sync::OnceLock<Mutex<Vec<std::sync::Weak<Peers>>>> = std::sync::OnceLock::new();
    D.get_or_init(|| Mutex::new(Vec::new()))
}

/// Registers `comm` for `SIGUSR1` dumps, starting the (one, process-wide) signal thread on first
/// use. The handler only wakes the thread; the thread writes the files.
pub(super) fn watch_sigusr1(comm: &Arc<Peers>) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    {
        let mut d = dumpers().lock().unwrap_or_else(|p| p.into_inner());
        d.retain(|w| w.strong_count() > 0);
        d.push(Arc::downgrade(comm));
    }
    STARTED.call_once(|| {
        let mut signals = match signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])
        {
            Ok(s) => s,
            Err(e) => {
                ccl_warn!(None, "cannot watch SIGUSR1 for flight-recorder dumps: {e}");
                return;
            }
        };
        let _ = std::thread::Builder::new()
            .name("ccl-sigusr1".into())
            .spawn(move || {
                for _ in signals.forever() {
                    let live: Vec<Arc<Peers>> = dumpers()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .filter_map(|w| w.upgrade())
                        .collect();
                    for c in live {
                        c.dump_trace("SIGUSR1");
                    }
                }
            });
    });
}

impl Peers {
    /// The flight recorder.
    pub(crate) fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.recorder.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The recorder as a dump, written now for `reason`.
    pub(crate) fn trace_dump(&self, reason: &str) -> Dump {
        Dump::of(&self.recorder(), &self.trace_meta(reason))
    }

    /// The recorder as JSON (what a dump file holds).
    pub(crate) fn trace_json(&self, reason: &str) -> String {
        self.trace_dump(reason).to_json()
    }

    pub(super) fn trace_meta(&self, reason: &str) -> Meta {
        Meta {
            comm: self.tag.clone(),
            rank: self.rank,
            size: self.size,
            host: ccl_core::log::hostname().to_string(),
            pid: std::process::id(),
            reason: reason.to_string(),
        }
    }

    /// Writes the recorder to `CCL_TRACE_DIR` and, in PyTorch's format, to
    /// `CCL_TRACE_TORCH_FILE`, those that are set; returns the file written to `CCL_TRACE_DIR`.
    pub(crate) fn dump_trace(&self, reason: &str) -> Option<std::path::PathBuf> {
        if let Some(prefix) = &self.config.trace_torch_file {
            let path = ccl_core::log::expand_path(prefix).replace("%c", &self.tag);
            let bytes = ccl_diag::torch::pickle(&self.trace_dump(reason));
            self.write_dump(
                std::path::PathBuf::from(format!("{path}{}", self.rank)),
                &bytes,
                reason,
            );
        }
        let dir = ccl_core::log::expand_path(self.config.trace_dir.as_deref()?);
        let path = std::path::Path::new(&dir).join(Dump::file_name(&self.tag, self.rank));
        self.write_dump(path, self.trace_json(reason).as_bytes(), reason)
    }

    /// Dumps the recorder on the first failure notice when this rank is in none of its
    /// operations: it learns of the failure only at its next call, and a rank in its own code
    /// is often the one the job waits for, whose dump (without the operation the others are
    /// in) an analyser needs most. A rank inside an operation dumps when that operation fails.
    pub(super) fn dump_outside_operations(&self, n: &ccl_bootstrap::Notice) {
        let outside = self
            .recorder()
            .current()
            .is_none_or(|e| e.state != ccl_diag::recorder::State::Running);
        if outside {
            let what = if n.died { "died" } else { "failed" };
            self.dump_trace(&format!(
                "rank {} {what} while this rank was outside ccl: {}",
                n.rank, n.message
            ));
        }
    }

    /// Writes a dump whole (a reader never sees half a file) and says where it went.
    pub(super) fn write_dump(
        &self,
        path: std::path::PathBuf,
        bytes: &[u8],
        reason: &str,
    ) -> Option<std::path::PathBuf> {
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let mut tmp = path.clone().into_os_string();
            tmp.push(format!(".tmp{}", std::process::id()));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &path)
        };
        match write() {
            Ok(()) => {
                ccl_warn!(
                    Some(self.rank),
                    "flight recorder written to {} ({reason})",
                    path.display()
                );
                Some(path)
            }
            Err(e) => {
                ccl_warn!(
                    Some(self.rank),
                    "cannot write the flight recorder to {}: {e}",
                    path.display()
                );
                None
            }
        }
    }
}
