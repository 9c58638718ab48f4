//! The SVG line chart `simulate --chart` writes.

use std::fmt::Write as _;

const COLOURS: [&str; 6] = [
    "#9e9e9e", "#1b5e20", "#1565c0", "#c62828", "#6a1b9a", "#ef6c00",
];

/// A line chart: x = time buckets, y = units per bucket.
pub(crate) fn svg(series: &[(&str, &[u64])], bucket_width: u64) -> String {
    let (width, height, left, bottom, top, right) = (900.0, 420.0, 60.0, 40.0, 30.0, 170.0);
    let points = series
        .iter()
        .map(|(_, s)| s.len())
        .max()
        .unwrap_or(0)
        .max(2);
    let peak = series
        .iter()
        .flat_map(|(_, s)| s.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let x = |i: usize| left + plot_w * i as f64 / (points - 1) as f64;
    let y = |v: u64| top + plot_h * (1.0 - v as f64 / peak);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<title>Admitted units per {} s, by algorithm</title>"#,
        bucket_width as f64 / 1e6
    );
    let _ = writeln!(
        svg,
        r##"<rect width="{width}" height="{height}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        svg,
        r##"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#000"/><line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="#000"/>"##,
        top + plot_h,
        left + plot_w,
        top + plot_h,
        top + plot_h
    );
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="{}">0</text><text x="4" y="{}">{peak}</text><text x="{left}" y="{}">time →  (one point per {} s)</text>"#,
        top + plot_h + 15.0,
        top + 4.0,
        height - 8.0,
        bucket_width as f64 / 1e6
    );
    for (i, (name, values)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = (0..points)
            .map(|p| format!("{:.1},{:.1}", x(p), y(values.get(p).copied().unwrap_or(0))))
            .collect();
        let dash = if i == 0 {
            r#" stroke-dasharray="4 3""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<polyline data-series="{name}" fill="none" stroke="{colour}" stroke-width="1.5"{dash} points="{}"/>"#,
            path.join(" ")
        );
        let ly = top + 18.0 * i as f64 + 6.0;
        let lx = left + plot_w + 15.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{name}</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}
