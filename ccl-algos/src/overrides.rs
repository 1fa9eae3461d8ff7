//! `CCL_ALGO`: per-collective algorithm overrides.
//!
//! Syntax: a single algorithm name applies to every collective that has it (`ring`); otherwise a
//! `;`-separated list of `collective:algorithm` pairs (`allreduce:ring;allgather:rd`). Unknown
//! names, and an algorithm named for a collective that lacks it, are errors, so a typo never
//! falls back to the automatic choice silently.

use crate::algo::{Algo, Collective};

/// Parsed `CCL_ALGO`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    by_coll: [Option<Algo>; Collective::ALL.len()],
}

fn index(c: Collective) -> usize {
    c.id() as usize
}

impl Overrides {
    /// The forced algorithm for `coll`, if any.
    pub fn get(&self, coll: Collective) -> Option<Algo> {
        self.by_coll[index(coll)]
    }

    /// Forces `algo` for `coll`.
    pub fn set(&mut self, coll: Collective, algo: Algo) -> Result<(), String> {
        if !coll.algos().contains(&algo) {
            let have: Vec<&str> = coll.algos().iter().map(|a| a.name()).collect();
            return Err(format!(
                "{coll} has no {algo} algorithm (it has {})",
                have.join(", ")
            ));
        }
        self.by_coll[index(coll)] = Some(algo);
        Ok(())
    }

    /// Back to the automatic choice for `coll`.
    pub fn clear(&mut self, coll: Collective) {
        self.by_coll[index(coll)] = None;
    }

    pub fn parse(spec: &str) -> Result<Overrides, String> {
        let mut o = Overrides::default();
        let spec = spec.trim();
        let err = |e: String| format!("CCL_ALGO='{spec}': {e}");
        if spec.is_empty() {
            return Ok(o);
        }
        if !spec.contains(':') {
            let algo: Algo = spec.parse().map_err(err)?;
            let mut any = false;
            for c in Collective::ALL {
                if c.algos().contains(&algo) {
                    o.by_coll[index(c)] = Some(algo);
                    any = true;
                }
            }
            if !any {
                return Err(err(format!("no collective has a {algo} algorithm")));
            }
            return Ok(o);
        }
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (coll, algo) = part
                .split_once(':')
                .ok_or_else(|| err(format!("'{part}' is not collective:algorithm")))?;
            let coll: Collective = coll.parse().map_err(err)?;
            let algo: Algo = algo.parse().map_err(err)?;
            o.set(coll, algo).map_err(err)?;
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert_eq!(Overrides::parse("").unwrap(), Overrides::default());
        assert_eq!(
            Overrides::parse("ring").unwrap().get(Collective::AllReduce),
            Some(Algo::Ring)
        );
        assert_eq!(
            Overrides::parse("allreduce:rd")
                .unwrap()
                .get(Collective::AllReduce),
            Some(Algo::RecursiveDoubling)
        );
        assert_eq!(
            Overrides::parse(" allreduce : ring ; ")
                .unwrap()
                .get(Collective::AllReduce),
            Some(Algo::Ring)
        );
        assert!(Overrides::parse("zigzag").unwrap_err().contains("zigzag"));
        assert!(
            Overrides::parse("allgatherv:ring")
                .unwrap_err()
                .contains("allgatherv")
        );
        assert!(
            Overrides::parse("allreduce:ring;x")
                .unwrap_err()
                .contains("'x'")
        );
        assert!(
            Overrides::parse("barrier:ring")
                .unwrap_err()
                .contains("barrier has no ring")
        );
    }
}
