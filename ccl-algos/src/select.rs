//! `CCL_ALGO`: per-collective algorithm overrides.
//!
//! Syntax: a single algorithm name applies to every collective that has it (`ring`); otherwise a
//! `;`-separated list of `collective:algorithm` pairs (`allreduce:ring`). Unknown names are
//! errors, so a typo does not silently fall back to automatic choice.

use crate::allreduce::Algo;

/// Parsed `CCL_ALGO`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub allreduce: Option<Algo>,
}

impl Overrides {
    pub fn parse(spec: &str) -> Result<Overrides, String> {
        let mut o = Overrides::default();
        let spec = spec.trim();
        if spec.is_empty() {
            return Ok(o);
        }
        if !spec.contains(':') {
            o.allreduce = Some(
                spec.parse()
                    .map_err(|e| format!("CCL_ALGO='{spec}': {e}"))?,
            );
            return Ok(o);
        }
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (coll, algo) = part.split_once(':').ok_or_else(|| {
                format!("CCL_ALGO='{spec}': '{part}' is not collective:algorithm")
            })?;
            match coll.trim().to_ascii_lowercase().as_str() {
                "allreduce" => {
                    o.allreduce = Some(
                        algo.parse()
                            .map_err(|e| format!("CCL_ALGO='{spec}': {e}"))?,
                    )
                }
                other => {
                    return Err(format!(
                        "CCL_ALGO='{spec}': unknown collective '{other}' (expected allreduce)"
                    ));
                }
            }
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
            Overrides::parse("ring").unwrap().allreduce,
            Some(Algo::Ring)
        );
        assert_eq!(
            Overrides::parse("allreduce:rd").unwrap().allreduce,
            Some(Algo::RecursiveDoubling)
        );
        assert_eq!(
            Overrides::parse(" allreduce : ring ; ").unwrap().allreduce,
            Some(Algo::Ring)
        );
        assert!(Overrides::parse("tree").unwrap_err().contains("tree"));
        assert!(
            Overrides::parse("allgather:ring")
                .unwrap_err()
                .contains("allgather")
        );
        assert!(
            Overrides::parse("allreduce:ring;x")
                .unwrap_err()
                .contains("'x'")
        );
    }
}
