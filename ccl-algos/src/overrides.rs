//! `CCL_ALGO`: per-collective algorithm overrides.
//!
//! Syntax: a single algorithm name applies to every collective that has it (`ring`); otherwise a
//! `;`-separated list of `collective:algorithm` pairs (`allreduce:ring;allgather:rd`). Unknown
//! names, and an algorithm named for a collective that lacks it, are errors, so a typo never
//! falls back to the automatic choice silently.

use crate::algo::{Algo, AlgoError, Collective};

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
    pub fn set(&mut self, coll: Collective, algo: Algo) -> Result<(), AlgoError> {
        if !coll.algos().contains(&algo) {
            return Err(AlgoError::NotOffered { coll, algo });
        }
        self.by_coll[index(coll)] = Some(algo);
        Ok(())
    }

    /// Back to the automatic choice for `coll`.
    pub fn clear(&mut self, coll: Collective) {
        self.by_coll[index(coll)] = None;
    }

    pub fn parse(spec: &str) -> Result<Overrides, AlgoError> {
        let mut o = Overrides::default();
        let spec = spec.trim();
        let err = |e: AlgoError| AlgoError::Setting {
            spec: spec.to_string(),
            error: Box::new(e),
        };
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
                return Err(err(AlgoError::NoCollectiveHas(algo)));
            }
            return Ok(o);
        }
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (coll, algo) = part
                .split_once(':')
                .ok_or_else(|| err(AlgoError::NotAPair(part.to_string())))?;
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
        let err = |spec: &str| Overrides::parse(spec).unwrap_err().to_string();
        assert_eq!(
            err("zigzag"),
            "CCL_ALGO='zigzag': unknown algorithm 'zigzag' (expected one of ring, rd, pairwise, tree, hd, hier, shm, hiershm)"
        );
        assert!(err("allgatherv:ring").contains("allgatherv"));
        assert!(err("allreduce:ring;x").contains("'x'"));
        assert_eq!(
            err("barrier:ring"),
            "CCL_ALGO='barrier:ring': barrier has no ring algorithm (it has rd)"
        );
    }
}
