//! What the symbolic run checks: hazards between ops of one rank, and every result against what the collective must compute.

use super::*;

/// Fails if op `id` of rank `r` reads data an earlier op that has not run yet still has to
/// write, or overwrites data such an op still has to read or write.
pub(super) fn check_hazards(
    st: &RankState,
    s: &Schedule,
    r: usize,
    id: OpId,
) -> Result<(), String> {
    let (reads, writes) = &st.access[id];
    for e in st.first_pending..id {
        if st.executed[e] {
            continue;
        }
        let (er, ew) = &st.access[e];
        let hit = |a: &[Region], b: &[Region]| {
            a.iter()
                .any(|x| b.iter().any(|y| x.overlaps(y) && x.len > 0 && y.len > 0))
        };
        if hit(ew, reads) || hit(er, writes) || hit(ew, writes) {
            return Err(format!(
                "rank {r}: op {id} ({:?}) ran before earlier op {e} ({:?}) touching the same data",
                s.ops[id].action, s.ops[e].action
            ));
        }
    }
    Ok(())
}

/// Checks every rank's result against what the setup expects, and that all are identical when
/// they must be.
pub(super) fn check_results(results: &[Vec<Slot>], setup: &Setup) -> Result<(), String> {
    let n = results.len();
    for (r, recv) in results.iter().enumerate() {
        for (i, v) in recv.iter().enumerate() {
            check_element(r, i, v, (setup.expect)(r, i), setup.op, n)?;
        }
    }
    if setup.identical {
        for r in 1..n {
            if results[r] != results[0] {
                let i = results[r]
                    .iter()
                    .zip(&results[0])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Err(format!(
                    "rank {r} and rank 0 differ at element {i} (not bit-identical)"
                ));
            }
        }
    }
    Ok(())
}

/// Checks element `i` of rank `r`'s result.
fn check_element(
    r: usize,
    i: usize,
    v: &Slot,
    expect: Option<Expect>,
    op: ReduceOp,
    n: usize,
) -> Result<(), String> {
    match expect {
        None => {}
        Some(Expect::Exact(want)) if *v != Some(want) => {
            return Err(format!("rank {r}: element {i} is {v:?}, expected {want:?}"));
        }
        Some(Expect::Exact(_)) => {}
        Some(Expect::Unwritten) if v.is_some() => {
            return Err(format!(
                "rank {r}: element {i} was written ({v:?}) but must be left alone"
            ));
        }
        Some(Expect::Unwritten) => {}
        Some(Expect::Reduced { mask, idx }) => {
            let v =
                v.ok_or_else(|| format!("rank {r}: element {i} of the result was never written"))?;
            if v.mask != mask || v.idx != idx {
                return Err(format!(
                    "rank {r}: element {i} holds element {} of ranks {:#x}, expected element {idx} of {mask:#x}",
                    v.idx, v.mask
                ));
            }
            // Dividing by a world size of one is exact, so schedules may skip it.
            if op == ReduceOp::Avg && v.divided != 1 && !(n == 1 && v.divided == 0) {
                return Err(format!("rank {r}: element {i} divided {} times", v.divided));
            }
        }
    }
    Ok(())
}
