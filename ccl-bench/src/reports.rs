//! `ccl-bench compare` and `ccl-bench plot`: tables and pictures of `--json` reports.

use std::path::PathBuf;
use std::process::ExitCode;

use ccl_diag::human_bytes;

use crate::{CompareArgs, PlotArgs, Report, plot};

/// One line per placement of a report, labelled with `prefix`.
pub(crate) fn series(r: &Report, prefix: &str) -> Vec<plot::Series> {
    ["out-of-place", "in-place"]
        .iter()
        .filter_map(|&placement| {
            let points: Vec<(f64, f64)> = r
                .results
                .iter()
                .filter(|row| row.placement == placement)
                .map(|row| (row.size as f64, row.busbw_gbs))
                .collect();
            (!points.is_empty()).then(|| plot::Series {
                label: format!("{prefix}{placement}"),
                points,
            })
        })
        .collect()
}

pub(crate) fn title(reports: &[&Report]) -> String {
    let mut parts: Vec<String> = reports
        .iter()
        .map(|r| format!("{}, {} ranks", r.collective, r.nranks))
        .collect();
    parts.dedup();
    format!("{} (busbw)", parts.join("; "))
}

fn read_reports(paths: &[PathBuf]) -> Result<Vec<Report>, String> {
    paths
        .iter()
        .map(|path| {
            std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<Report>(&t).map_err(|e| e.to_string()))
                .map_err(|e| format!("{}: not a ccl-bench --json report: {e}", path.display()))
        })
        .collect()
}

fn stem(path: &std::path::Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `ccl-bench compare A.json B.json ... auto.json`
pub(crate) fn compare_reports(c: &CompareArgs) -> ExitCode {
    let table = read_reports(&c.reports).and_then(|r| compare_table(&r, &c.reports));
    match table {
        Ok(t) => {
            print!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ccl-bench compare: {e}");
            ExitCode::from(2)
        }
    }
}

/// The Markdown table `compare` prints.
fn compare_table(reports: &[Report], paths: &[PathBuf]) -> Result<String, String> {
    let first = reports.first().ok_or("no reports")?;
    for (r, p) in reports.iter().zip(paths) {
        if r.collective != first.collective || r.nranks != first.nranks {
            return Err(format!(
                "{} is {} over {} ranks, {} is {} over {} ranks",
                p.display(),
                r.collective,
                r.nranks,
                paths[0].display(),
                first.collective,
                first.nranks
            ));
        }
    }
    Ok(Medians::of(reports, paths).render())
}

/// One (time in us, algorithm) per size and column.
type Cells = std::collections::BTreeMap<usize, Vec<Option<(f64, String)>>>;

/// The out-of-place results of several reports as columns: one per name (a report's file name up
/// to its first dot; repeats of a name share its column, which holds their median).
struct Medians {
    names: Vec<String>,
    /// The column named `auto`, if any: runs that let the cost model choose.
    auto: Option<usize>,
    cells: Cells,
}

impl Medians {
    fn of(reports: &[Report], paths: &[PathBuf]) -> Medians {
        // Columns in order of first appearance; repeats share one.
        let mut names: Vec<String> = Vec::new();
        let column: Vec<usize> = paths
            .iter()
            .map(|p| {
                let n = stem(p).split('.').next().unwrap_or_default().to_string();
                names.iter().position(|x| *x == n).unwrap_or_else(|| {
                    names.push(n);
                    names.len() - 1
                })
            })
            .collect();
        let auto = names.iter().position(|n| n == "auto");
        // size -> per column the (time, algorithm) of every repeat, out of place.
        let mut samples: std::collections::BTreeMap<usize, Vec<Vec<(f64, String)>>> =
            Default::default();
        for (r, &c) in reports.iter().zip(&column) {
            for row in r.results.iter().filter(|x| x.placement == "out-of-place") {
                samples
                    .entry(row.size)
                    .or_insert_with(|| vec![Vec::new(); names.len()])[c]
                    .push((row.time_us, row.algo.clone()));
            }
        }
        let cells = samples
            .into_iter()
            .map(|(size, cols)| {
                let medians = cols
                    .into_iter()
                    .map(|mut v| {
                        v.sort_by(|a, b| a.0.total_cmp(&b.0));
                        let mid = v.len() / 2;
                        v.into_iter().nth(mid)
                    })
                    .collect();
                (size, medians)
            })
            .collect();
        Medians { names, auto, cells }
    }

    fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        out.push_str("| size |");
        for n in &self.names {
            let _ = write!(out, " {n} (us) |");
        }
        if self.auto.is_some() {
            out.push_str(" auto picked | picked / best | auto run / best |");
        }
        out.push('\n');
        out.push_str(&"|---".repeat(self.names.len() + 1 + 3 * usize::from(self.auto.is_some())));
        out.push_str("|\n");
        // Two views of the automatic choice: the time its algorithm took in that algorithm's own
        // sweep (what the choice is worth, free of the auto run's noise), and the auto run itself.
        let mut worst: (f64, f64) = (0.0, 0.0);
        for (size, cols) in &self.cells {
            // The fastest among the fixed algorithms (the auto column is not a contender).
            let best = cols
                .iter()
                .enumerate()
                .filter(|&(i, _)| Some(i) != self.auto)
                .filter_map(|(i, c)| c.as_ref().map(|(t, _)| (i, *t)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let _ = write!(out, "| {} |", human_bytes(*size as u64));
            for (i, c) in cols.iter().enumerate() {
                match c {
                    Some((t, _)) if best.is_some_and(|b| b.0 == i) => {
                        let _ = write!(out, " **{t:.1}** |");
                    }
                    Some((t, _)) => {
                        let _ = write!(out, " {t:.1} |");
                    }
                    None => out.push_str(" - |"),
                }
            }
            if let Some(a) = self.auto {
                out.push_str(&self.auto_cells(cols, a, best.map(|b| b.1), &mut worst));
            }
            out.push('\n');
        }
        if self.auto.is_some() {
            let _ = writeln!(
                out,
                "\nWorst picked / best: {:.2}; worst auto run / best: {:.2}",
                worst.0, worst.1
            );
        }
        out
    }

    /// The auto column's extra cells of one row (its algorithm, its own sweep's time and the
    /// auto run's time over the `best` fixed time), raising the worst ratios seen so far.
    fn auto_cells(
        &self,
        cols: &[Option<(f64, String)>],
        auto: usize,
        best: Option<f64>,
        worst: &mut (f64, f64),
    ) -> String {
        let (Some((t, algo)), Some(b)) = (&cols[auto], best) else {
            return " - | - | - |".into();
        };
        if b <= 0.0 {
            return " - | - | - |".into();
        }
        let picked = self
            .names
            .iter()
            .position(|n| n == algo)
            .and_then(|i| cols[i].as_ref())
            .map(|(tp, _)| tp / b);
        worst.1 = worst.1.max(t / b);
        let picked = match picked {
            Some(x) => {
                worst.0 = worst.0.max(x);
                format!("{x:.2}")
            }
            None => "-".into(),
        };
        format!(" {algo} | {picked} | {:.2} |", t / b)
    }
}

/// `ccl-bench plot OUT.svg A.json B.json ...`
pub(crate) fn plot_reports(p: &PlotArgs) -> ExitCode {
    let reports = match read_reports(&p.reports) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ccl-bench plot: {e}");
            return ExitCode::from(2);
        }
    };
    let lines: Vec<plot::Series> = reports
        .iter()
        .zip(&p.reports)
        .flat_map(|(r, path)| {
            let name = stem(path);
            let algos: Vec<&str> = {
                let mut a: Vec<&str> = r.results.iter().map(|x| x.algo.as_str()).collect();
                a.dedup();
                a
            };
            series(
                r,
                &format!("{name} ({}, {}) ", r.transport, algos.join("/")),
            )
        })
        .collect();
    let refs: Vec<&Report> = reports.iter().collect();
    let t = p.title.clone().unwrap_or_else(|| title(&refs));
    if let Err(e) = std::fs::write(&p.out, plot::svg(&t, &lines)) {
        eprintln!("ccl-bench plot: cannot write {}: {e}", p.out.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Row;

    fn report(rows: &[(usize, f64, &str)]) -> Report {
        let row = |&(size, time_us, algo): &(usize, f64, &str), placement: &str| Row {
            size,
            count: size,
            dtype: "uint8".into(),
            op: "sum".into(),
            placement: placement.into(),
            algo: algo.into(),
            time_us,
            algbw_gbs: 0.0,
            busbw_gbs: 0.0,
            wrong: 0,
        };
        Report {
            collective: "allreduce".into(),
            nranks: 4,
            transport: "tcp".into(),
            // In-place rows are left out of the comparison.
            results: rows
                .iter()
                .flat_map(|r| [row(r, "out-of-place"), row(r, "in-place")])
                .collect(),
        }
    }

    #[test]
    fn compare_table_takes_medians_and_rates_the_automatic_choice() {
        let reports = [
            report(&[(8, 10.0, "ring"), (64, 4.0, "ring"), (1024, 100.0, "ring")]),
            report(&[(8, 5.0, "tree"), (1024, 200.0, "tree")]),
            report(&[(8, 6.0, "tree"), (64, 3.0, "hd"), (1024, 150.0, "ring")]),
            report(&[(8, 7.0, "tree"), (1024, 110.0, "ring")]),
            report(&[(8, 100.0, "tree"), (1024, 120.0, "ring")]),
        ];
        let paths: Vec<PathBuf> = ["ring.json", "tree.json", "auto.1.json", "auto.2.json"]
            .iter()
            .chain(&["x/auto.3.json"])
            .map(PathBuf::from)
            .collect();
        let want = "\
| size | ring (us) | tree (us) | auto (us) | auto picked | picked / best | auto run / best |
|---|---|---|---|---|---|---|
| 8 B | 10.0 | **5.0** | 7.0 | tree | 1.00 | 1.40 |
| 64 B | **4.0** | - | 3.0 | hd | - | 0.75 |
| 1 KiB | **100.0** | 200.0 | 120.0 | ring | 1.00 | 1.20 |

Worst picked / best: 1.00; worst auto run / best: 1.40
";
        assert_eq!(compare_table(&reports, &paths).unwrap(), want);
    }

    #[test]
    fn compare_table_refuses_reports_of_different_jobs() {
        let mut other = report(&[(8, 1.0, "ring")]);
        other.nranks = 8;
        let reports = [report(&[(8, 1.0, "ring")]), other];
        let paths = [PathBuf::from("a.json"), PathBuf::from("b.json")];
        let e = compare_table(&reports, &paths).unwrap_err();
        assert!(e.contains("b.json is allreduce over 8 ranks"), "{e}");
    }
}
