//! SVG plots of bus bandwidth against size, one line per run (transport, algorithm, collective),
//! and Chrome traces of a run, one track per rank.

use std::fmt::Write as _;

/// One line: a label and (size in bytes, busbw GB/s) points.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

fn size_label(b: f64) -> String {
    let b = b as u64;
    for (u, s) in [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if b >= s && b % s == 0 {
            return format!("{}{u}", b / s);
        }
    }
    format!("{b}")
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Bus bandwidth (GB/s, linear) against size (bytes, log scale).
pub fn svg(title: &str, series: &[Series]) -> String {
    let (w, h) = (860.0, 520.0);
    let (l, r, t, b) = (70.0, 220.0, 40.0, 60.0);
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.0 > 0.0);
    let (mut xmin, mut xmax, mut ymax) = (f64::MAX, 0.0f64, 0.0f64);
    for &(x, y) in pts {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
        ymax = ymax.max(y);
    }
    if xmin > xmax {
        (xmin, xmax) = (1.0, 2.0);
    }
    if xmax <= xmin {
        xmax = xmin * 2.0;
    }
    let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let (lx0, lx1) = (xmin.log2(), xmax.log2());
    let px = |x: f64| l + (x.log2() - lx0) / (lx1 - lx0) * (w - l - r);
    let py = |y: f64| h - b - y / ymax * (h - t - b);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        (l + w - r) / 2.0,
        esc(title)
    );
    // Grid: powers of two along x, tenths along y.
    // Ticks on multiples of the step, so 1K, 1M, 1G are labelled whenever the step allows.
    let step = (((lx1 - lx0) / 12.0).ceil() as i64).max(1);
    let mut e = (lx0.ceil() as i64).div_euclid(step) * step;
    if (e as f64) < lx0 {
        e += step;
    }
    while (e as f64) <= lx1 {
        let x = px(2f64.powi(e as i32));
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{t}" x2="{x:.1}" y2="{}" stroke="#ddd"/>"##,
            h - b
        );
        let _ = write!(
            s,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            h - b + 16.0,
            size_label(2f64.powi(e as i32))
        );
        e += step;
    }
    for k in 0..=10 {
        let y = ymax * k as f64 / 10.0;
        let yy = py(y);
        let _ = write!(
            s,
            r##"<line x1="{l}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#eee"/>"##,
            w - r
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{y:.2}</text>"#,
            l - 6.0,
            yy + 4.0
        );
    }
    let _ = write!(
        s,
        r##"<rect x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
        w - l - r,
        h - t - b
    );
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">size (bytes)</text>"#,
        (l + w - r) / 2.0,
        h - 18.0
    );
    let _ = write!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">busbw (GB/s)</text>"#,
        (t + h - b) / 2.0,
        (t + h - b) / 2.0
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let path: Vec<String> = se
            .points
            .iter()
            .filter(|p| p.0 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (x, y) = p.split_once(',').expect("x,y");
            let _ = write!(s, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{c}"/>"#);
        }
        let ly = t + 14.0 + 20.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/>"#,
            w - r + 12.0,
            w - r + 36.0
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            w - r + 42.0,
            ly + 4.0,
            esc(&se.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A Chrome trace (chrome://tracing, Perfetto) from every rank's flight recorder (the JSON that
/// `Communicator::trace_json` returns): one track (process) per rank, one slice per operation.
pub fn chrome_trace(dumps: &[serde_json::Value]) -> String {
    let t0 = dumps
        .iter()
        .flat_map(|d| d["entries"].as_array().into_iter().flatten())
        .filter_map(|e| e["start_us"].as_u64())
        .min()
        .unwrap_or(0);
    let mut events = Vec::new();
    for d in dumps {
        let rank = d["rank"].as_u64().unwrap_or(0);
        events.push(serde_json::json!({
            "ph": "M", "name": "process_name", "pid": rank, "tid": 0,
            "args": { "name": format!("rank {rank} ({})", d["host"].as_str().unwrap_or("")) }
        }));
        events.push(serde_json::json!({
            "ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": { "sort_index": rank }
        }));
        for e in d["entries"].as_array().into_iter().flatten() {
            let start = e["start_us"].as_u64().unwrap_or(t0);
            let end = e["end_us"].as_u64().unwrap_or(start).max(start);
            events.push(serde_json::json!({
                "ph": "X",
                "name": format!("{} {} B", e["name"].as_str().unwrap_or("?"), e["bytes"]),
                "cat": e["algo"],
                "pid": rank,
                "tid": 0,
                "ts": start - t0,
                "dur": end - start,
                "args": { "seq": e["seq"], "algo": e["algo"], "dtype": e["dtype"], "state": e["state"] }
            }));
        }
    }
    serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_a_line_per_series() {
        let s = svg(
            "allreduce <4 ranks>",
            &[
                Series {
                    label: "tcp".into(),
                    points: vec![(8.0, 0.0), (1024.0, 0.5), (1048576.0, 2.0)],
                },
                Series {
                    label: "local".into(),
                    points: vec![(8.0, 0.1), (1048576.0, 4.0)],
                },
            ],
        );
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("&lt;4 ranks&gt;") && s.contains("1M") && s.ends_with("</svg>\n"));
        // Empty input still gives a valid picture.
        assert!(svg("x", &[]).contains("</svg>"));
    }

    #[test]
    fn chrome_trace_has_a_track_per_rank() {
        let d = |r: u64| {
            serde_json::json!({"rank": r, "host": "h", "entries": [
                {"seq": 1, "name": "allreduce", "bytes": 8, "algo": "ring", "dtype": "float", "state": "done", "start_us": 100 + r, "end_us": 150}
            ]})
        };
        let t: serde_json::Value = serde_json::from_str(&chrome_trace(&[d(0), d(1)])).unwrap();
        let ev = t["traceEvents"].as_array().unwrap();
        let pids: std::collections::BTreeSet<u64> = ev
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids.len(), 2);
        assert!(ev.iter().any(|e| e["ph"] == "X" && e["ts"] == 0));
    }
}
