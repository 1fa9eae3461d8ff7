//! SVG plots of bus bandwidth against size, one line per run (transport, algorithm, collective).

use std::fmt::Write as _;

/// One line: a label and (size in bytes, busbw GB/s) points.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Ten colours that stay apart for most kinds of colour vision (Tableau 10), and dash patterns
/// to combine them with: series `i` takes colour `i % 10` and dash `(i / 10) % 5`, so the first
/// fifty series all differ in colour or in dash.
const COLORS: [&str; 10] = [
    "#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
    "#ff9da7", "#555555",
];
const DASHES: [&str; 5] = ["", "6 3", "2 2", "8 3 2 3", "12 4"];
/// Marker shapes, so series stay apart in grey print too.
const MARKERS: usize = 4;

/// The colour, dash pattern and marker of series `i`.
pub(crate) fn style(i: usize) -> (&'static str, &'static str, usize) {
    (
        COLORS[i % COLORS.len()],
        DASHES[(i / COLORS.len()) % DASHES.len()],
        i % MARKERS,
    )
}

fn num_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 100.0 || (v.fract() == 0.0 && a >= 1.0) {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// How an axis is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Axis {
    /// Byte sizes on a log2 scale (labels 1K, 1M, ...).
    Bytes,
    /// Plain numbers; log10 when `log` (or when the values span more than 30x, see [`Chart`]).
    Number { log: bool },
}

/// A picture: title, axis labels and kinds.
#[derive(Clone, Debug)]
pub(crate) struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x: Axis,
    /// `None`: log10 when the y values span more than 30x, linear from 0 otherwise.
    pub y_log: Option<bool>,
}

/// Bus bandwidth (GB/s) against size (bytes, log scale).
pub(crate) fn svg(title: &str, series: &[Series]) -> String {
    chart(
        &Chart {
            title: title.to_string(),
            x_label: "size (bytes)".into(),
            y_label: "busbw (GB/s)".into(),
            x: Axis::Bytes,
            y_log: None,
        },
        series,
    )
}

/// Ticks of a log axis between `lo` and `hi` (log10 units): 1, 2, 5 per decade when there is
/// room, else powers of ten.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades = hi - lo;
    let mults: &[f64] = if decades <= 2.5 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let step = ((decades / 8.0).ceil() as i32).max(1);
    let mut out = Vec::new();
    let mut e = lo.floor() as i32;
    while f64::from(e) <= hi + 1e-9 {
        if e.rem_euclid(step) == 0 || mults.len() > 1 {
            for m in mults {
                let v = m * 10f64.powi(e);
                let lv = v.log10();
                if lv >= lo - 1e-9 && lv <= hi + 1e-9 {
                    out.push(v);
                }
            }
        }
        e += 1;
    }
    out
}

/// Ticks of a linear axis from 0 to `hi`: about eight at 1, 2 or 5 times a power of ten.
fn lin_ticks(hi: f64) -> Vec<f64> {
    let raw = hi / 8.0;
    let p = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p);
    (0..)
        .map(|k| k as f64 * step)
        .take_while(|v| *v <= hi * (1.0 + 1e-9))
        .collect()
}

/// Where everything goes on one chart: the picture's size, the plot's box and the scales.
struct Frame {
    w: f64,
    h: f64,
    /// Left, top and bottom margins around the plot.
    l: f64,
    t: f64,
    b: f64,
    /// The plot's width and height.
    pw: f64,
    ph: f64,
    x: Axis,
    x_log: bool,
    y_log: bool,
    /// The axes' ranges, in scale units (log2 or log10 of the value, or the value).
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    /// The legend's columns and their width.
    cols: usize,
    col_w: f64,
}

impl Frame {
    /// Lays out a chart of `series`: columns of the legend as wide as the longest label allows
    /// and as many rows as needed (the picture grows to fit), axes that span the finite points.
    fn new(c: &Chart, series: &[Series]) -> Frame {
        let (w, l, r, t, b, ph) = (900.0, 80.0, 30.0, 44.0, 56.0, 420.0);
        let longest = series
            .iter()
            .map(|s| s.label.chars().count())
            .max()
            .unwrap_or(0);
        let col_w = (longest as f64 * 7.0 + 46.0).clamp(120.0, w - l - r);
        let cols = (((w - l - r) / col_w).floor() as usize).max(1);
        let legend_h = if series.is_empty() {
            0.0
        } else {
            series.len().div_ceil(cols) as f64 * 18.0 + 12.0
        };
        let pts: Vec<(f64, f64)> = finite(series).collect();
        let x_log = matches!(c.x, Axis::Bytes | Axis::Number { log: true });
        let (mut xmin, mut xmax) = pts
            .iter()
            .map(|p| p.0)
            .filter(|x| !x_log || *x > 0.0)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |a, x| {
                (a.0.min(x), a.1.max(x))
            });
        if !xmin.is_finite() {
            (xmin, xmax) = (1.0, 2.0);
        }
        if xmax <= xmin {
            xmax = if x_log { xmin * 2.0 } else { xmin + 1.0 };
        }
        let ypos: Vec<f64> = pts.iter().map(|p| p.1).filter(|y| *y > 0.0).collect();
        let (ymin, ymax) = ypos
            .iter()
            .fold((f64::INFINITY, 0.0f64), |a, &y| (a.0.min(y), a.1.max(y)));
        let y_log = c
            .y_log
            .unwrap_or(ymin.is_finite() && ymax / ymin > 30.0 && ypos.len() == pts.len());
        let (x0, x1) = match c.x {
            Axis::Bytes => (xmin.log2(), xmax.log2()),
            Axis::Number { log: true } => (xmin.log10(), xmax.log10()),
            Axis::Number { log: false } => (xmin.min(0.0), xmax),
        };
        let (y0, y1) = if y_log && ymin.is_finite() {
            (
                ymin.log10().floor(),
                ymax.log10().ceil().max(ymin.log10().floor() + 1.0),
            )
        } else {
            (0.0, if ymax > 0.0 { ymax * 1.1 } else { 1.0 })
        };
        Frame {
            w,
            h: t + ph + b + legend_h,
            l,
            t,
            b,
            pw: w - l - r,
            ph,
            x: c.x,
            x_log,
            y_log,
            x0,
            x1,
            y0,
            y1,
            cols,
            col_w,
        }
    }

    fn bottom(&self) -> f64 {
        self.t + self.ph
    }

    /// The picture's x of value `x`.
    fn px(&self, x: f64) -> f64 {
        let fx = match self.x {
            Axis::Bytes => x.log2(),
            Axis::Number { log: true } => x.log10(),
            Axis::Number { log: false } => x,
        };
        self.l + (fx - self.x0) / (self.x1 - self.x0) * self.pw
    }

    /// The picture's y of value `y`.
    fn py(&self, y: f64) -> f64 {
        let fy = if self.y_log { y.max(1e-300).log10() } else { y };
        self.bottom() - (fy - self.y0) / (self.y1 - self.y0) * self.ph
    }

    /// Whether a point can be drawn on these axes (log axes have no place for 0 or less).
    fn shows(&self, p: (f64, f64)) -> bool {
        (!self.x_log || p.0 > 0.0) && (!self.y_log || p.1 > 0.0)
    }

    /// The x ticks and their labels: powers of two for sizes, the values themselves when there
    /// are few (QPs 1, 2, 4, 8, 16; rank counts), else 1-2-5 or decades.
    fn x_ticks(&self, series: &[Series]) -> Vec<(f64, String)> {
        match self.x {
            Axis::Bytes => {
                let step = (((self.x1 - self.x0) / 12.0).ceil() as i64).max(1);
                let mut e = (self.x0.ceil() as i64).div_euclid(step) * step;
                if (e as f64) < self.x0 {
                    e += step;
                }
                let mut v = Vec::new();
                while (e as f64) <= self.x1 + 1e-9 {
                    let x = 2f64.powi(e as i32);
                    v.push((x, ccl_diag::human_bytes(x as u64)));
                    e += step;
                }
                v
            }
            Axis::Number { log: true } => {
                let mut seen: Vec<f64> = finite(series).map(|p| p.0).filter(|x| *x > 0.0).collect();
                seen.sort_by(|a, b| a.total_cmp(b));
                seen.dedup();
                if seen.len() > 12 {
                    seen = log_ticks(self.x0, self.x1);
                }
                seen.into_iter().map(|x| (x, num_label(x))).collect()
            }
            Axis::Number { log: false } => lin_ticks(self.x1)
                .into_iter()
                .map(|x| (x, num_label(x)))
                .collect(),
        }
    }
}

/// The finite points of every series.
fn finite(series: &[Series]) -> impl Iterator<Item = (f64, f64)> + '_ {
    series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|p| p.0.is_finite() && p.1.is_finite())
}

/// Draws `series` on one chart. Every series has its own colour/dash/marker; the legend sits
/// inside the picture, below the plot, in as many rows as it needs (the picture grows to fit).
pub(crate) fn chart(c: &Chart, series: &[Series]) -> String {
    let f = Frame::new(c, series);
    let (w, h) = (f.w, f.h);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>"#,
        f.l + f.pw / 2.0,
        esc(&c.title)
    );
    axes(&mut s, &f, c, series);
    for (i, se) in series.iter().enumerate() {
        line(&mut s, &f, i, se);
    }
    s.push_str("</svg>\n");
    s
}

/// The grid, the tick labels, the plot's box and the axis labels.
fn axes(s: &mut String, f: &Frame, c: &Chart, series: &[Series]) {
    let (l, t, pw, bottom) = (f.l, f.t, f.pw, f.bottom());
    for (x, label) in &f.x_ticks(series) {
        let xx = f.px(*x);
        let _ = write!(
            s,
            r##"<line x1="{xx:.1}" y1="{t}" x2="{xx:.1}" y2="{bottom}" stroke="#ddd"/>"##
        );
        let _ = write!(
            s,
            r#"<text x="{xx:.1}" y="{}" text-anchor="middle">{}</text>"#,
            bottom + 16.0,
            esc(label)
        );
    }
    let yticks = if f.y_log {
        log_ticks(f.y0, f.y1)
    } else {
        lin_ticks(f.y1)
    };
    for y in yticks {
        let yy = f.py(y);
        let _ = write!(
            s,
            r##"<line x1="{l}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#eee"/>"##,
            l + pw
        );
        let _ = write!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            l - 6.0,
            yy + 4.0,
            num_label(y)
        );
    }
    let _ = write!(
        s,
        r##"<rect x="{l}" y="{t}" width="{pw}" height="{}" fill="none" stroke="#333"/>"##,
        f.ph
    );
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        l + pw / 2.0,
        bottom + 36.0,
        esc(&c.x_label)
    );
    let yl = if f.y_log {
        format!("{} (log scale)", c.y_label)
    } else {
        c.y_label.clone()
    };
    let _ = write!(
        s,
        r#"<text x="18" y="{0}" text-anchor="middle" transform="rotate(-90 18 {0})">{1}</text>"#,
        t + f.ph / 2.0,
        esc(&yl)
    );
}

/// Series `i`'s line with its markers, and its legend entry (row-major under the plot).
fn line(s: &mut String, f: &Frame, i: usize, se: &Series) {
    let (col, dash, marker) = style(i);
    let path: Vec<(f64, f64)> = se
        .points
        .iter()
        .copied()
        .filter(|p| p.0.is_finite() && p.1.is_finite() && f.shows(*p))
        .map(|(x, y)| (f.px(x), f.py(y)))
        .collect();
    let dash_attr = if dash.is_empty() {
        String::new()
    } else {
        format!(r#" stroke-dasharray="{dash}""#)
    };
    let pts: Vec<String> = path.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    let _ = write!(
        s,
        r#"<polyline fill="none" stroke="{col}" stroke-width="2"{dash_attr} points="{}"/>"#,
        pts.join(" ")
    );
    for &(x, y) in &path {
        s.push_str(&mark(marker, x, y, col));
    }
    let (row, colm) = (i / f.cols, i % f.cols);
    let lx = f.l + colm as f64 * f.col_w;
    let ly = f.bottom() + f.b + 6.0 + row as f64 * 18.0;
    let _ = write!(
        s,
        r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{col}" stroke-width="2.5"{dash_attr}/>"#,
        lx + 30.0
    );
    s.push_str(&mark(marker, lx + 15.0, ly, col));
    let _ = write!(
        s,
        r#"<text x="{}" y="{}">{}</text>"#,
        lx + 36.0,
        ly + 4.0,
        esc(&se.label)
    );
}

/// A small marker of shape `k` at (x, y).
fn mark(k: usize, x: f64, y: f64, col: &str) -> String {
    match k {
        0 => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{col}"/>"#),
        1 => format!(
            r#"<rect x="{:.1}" y="{:.1}" width="6" height="6" fill="{col}"/>"#,
            x - 3.0,
            y - 3.0
        ),
        2 => format!(
            r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{col}"/>"#,
            x,
            y - 4.0,
            x - 3.5,
            y + 3.0,
            x + 3.5,
            y + 3.0
        ),
        _ => format!(
            r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="none" stroke="{col}" stroke-width="1.5"/>"#,
            x,
            y - 4.0,
            x + 4.0,
            y,
            x,
            y + 4.0,
            x - 4.0,
            y
        ),
    }
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
        assert!(s.contains("&lt;4 ranks&gt;") && s.contains("1 MiB") && s.ends_with("</svg>\n"));
        // Empty input still gives a valid picture.
        assert!(svg("x", &[]).contains("</svg>"));
    }

    #[test]
    fn every_series_is_distinct_and_the_legend_is_inside() {
        let many: Vec<Series> = (0..23)
            .map(|i| Series {
                label: format!("series number {i} with a long label"),
                points: vec![(1.0, 1.0 + i as f64), (2.0, 2.0 + i as f64)],
            })
            .collect();
        let styles: std::collections::BTreeSet<(&str, &str, usize)> =
            (0..many.len()).map(style).collect();
        assert_eq!(styles.len(), many.len());
        let pic = chart(
            &Chart {
                title: "t".into(),
                x_label: "x".into(),
                y_label: "y".into(),
                x: Axis::Number { log: false },
                y_log: None,
            },
            &many,
        );
        // Every text element (the legend's included) lies inside the picture.
        let num = |s: &str, key: &str| -> f64 {
            let i = s.find(key).unwrap() + key.len();
            s[i..].split('"').next().unwrap().parse().unwrap()
        };
        let (w, h) = (num(&pic, "width=\""), num(&pic, "height=\""));
        for piece in pic.split("<text ").skip(1) {
            let (x, y) = (num(piece, "x=\""), num(piece, "y=\""));
            assert!(
                x >= 0.0 && x < w - 20.0 && y > 0.0 && y <= h,
                "({x}, {y}) outside {w}x{h}"
            );
        }
        assert_eq!(pic.matches("<polyline").count(), 23);
    }

    #[test]
    fn values_spanning_decades_get_a_log_axis() {
        let s = [Series {
            label: "a".into(),
            points: vec![(8.0, 0.001), (1024.0, 0.1), (1048576.0, 20.0)],
        }];
        assert!(svg("x", &s).contains("(log scale)"));
        let s = [Series {
            label: "a".into(),
            points: vec![(8.0, 1.0), (1024.0, 2.0)],
        }];
        assert!(!svg("x", &s).contains("(log scale)"));
    }
}
