//! Every sentence that names a culprit outside a gathered verdict: what a rank concludes when
//! the job's monitor cannot give one (its process died, it does not answer, the hub between
//! them is silent) and the verdict the monitor's new process gives for the death that moved
//! it. [`verdict`](crate::verdict) writes the gathered ones with the same phrases.
//!
//! Each takes a rank already described (`rank 3 (host:pid)`) and what this rank saw, so the
//! sentence reads the same whichever crate found the case.

/// How a verdict says a rank died.
pub const DIED: &str = "which died (its process ended)";
/// How a verdict says a rank does not answer the monitor.
pub const SILENT: &str = "which does not answer (stopped, or its process is hung)";
/// How a verdict says a rank left nothing to read.
pub const NO_STATE: &str = "which left no state (stopped, killed, or stuck outside ccl)";

/// `verdict: ...; ` before a message, when there is a verdict.
pub fn verdict_prefix(verdict: &str) -> String {
    if verdict.is_empty() {
        String::new()
    } else {
        format!("verdict: {verdict}; ")
    }
}

/// The monitor ran in `root`'s process, and its line closed: that rank died.
pub fn root_died(root: &str, seen: &str) -> String {
    format!(
        "verdict: the job is stuck behind {root}, which died (its process ended: the job's \
         rendezvous, which it ran, closed); seen here as: {seen}"
    )
}

/// The monitor in `root`'s process did not acknowledge this rank's report within `secs`.
pub fn root_silent(root: &str, secs: f64, seen: &str) -> String {
    format!(
        "verdict: the job is stuck behind {root}, {SILENT}: the job's monitor runs in its \
         process and did not acknowledge this rank's report within {secs:.1} s; {seen}"
    )
}

/// This rank reports through `hub` to the monitor (`root`: `in rank R (...)'s process` or `at
/// ADDRESS`), and no acknowledgement came within `secs`: one of the two is the culprit.
pub fn hub_or_root_silent(hub: &str, root: &str, secs: f64, seen: &str) -> String {
    format!(
        "the job's monitor did not acknowledge this rank's report within {secs:.1} s: this rank \
         reports through {hub}, its hub, to the rendezvous {root}, and one of the two is \
         stopped or hung; {seen}"
    )
}

/// The verdict of the monitor's new process: `dead`, in whose process the monitor ran, died;
/// `taker` runs the monitor now.
pub fn died_with_monitor(dead: &str, taker: usize) -> String {
    format!(
        "the job is stuck behind {dead}, which died, and the job's monitor with it (it ran in \
         its process); rank {taker} took the monitor over"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_name_the_culprit_and_keep_what_was_seen() {
        let r = "rank 3 (h:42)";
        assert!(root_died(r, "peer 1 closed").starts_with("verdict: the job is stuck behind"));
        assert!(root_died(r, "peer 1 closed").ends_with("seen here as: peer 1 closed"));
        let s = root_silent(r, 1.5, "timeout");
        assert!(
            s.contains(r) && s.contains("within 1.5 s") && s.ends_with("; timeout"),
            "{s}"
        );
        assert!(s.contains(SILENT), "{s}");
        let h = hub_or_root_silent("rank 2 (h:7)", "at 10.0.0.1:5", 1.5, "timeout");
        assert!(h.contains("through rank 2 (h:7), its hub, to the rendezvous at 10.0.0.1:5"));
        assert!(died_with_monitor(r, 4).ends_with("rank 4 took the monitor over"));
        assert_eq!(verdict_prefix(""), "");
        assert_eq!(verdict_prefix("x"), "verdict: x; ");
    }
}
