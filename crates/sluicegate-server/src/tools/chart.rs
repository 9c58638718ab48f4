//! The SVG chart `simulate --chart` writes: small multiples, one panel per algorithm on
//! shared axes, each showing the most units one key had admitted within a window against
//! the limit line, the exact sliding log as the reference in every panel and the
//! over-admission shaded where it happens; the offered load on a panel of its own, so
//! that its scale does not flatten the others.

use std::fmt::Write as _;

/// What the chart shows; every series has one value per time bucket.
pub(crate) struct Chart<'a> {
    /// µs per bucket.
    pub(crate) bucket_width: u64,
    /// The rule's window and limit, µs and units.
    pub(crate) window: u64,
    pub(crate) limit: u64,
    /// Units offered per bucket, every key together.
    pub(crate) offered: &'a [u64],
    /// Per algorithm, the most units one key held within its window `(t − W, t]` during
    /// each bucket. The first is the exact sliding log: every panel's reference.
    pub(crate) algorithms: &'a [(&'a str, &'a [u64])],
}

const WIDTH: f64 = 960.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 24.0;
const OFFERED_TOP: f64 = 96.0;
const OFFERED_HEIGHT: f64 = 80.0;
const PANEL_HEIGHT: f64 = 96.0;
/// Above each panel: its title line.
const PANEL_GAP: f64 = 34.0;
const REFERENCE_COLOUR: &str = "#9e9e9e";
const LIMIT_COLOUR: &str = "#c62828";
const OVER_COLOUR: &str = "#ef5350";
const COLOURS: [&str; 5] = ["#424242", "#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a"];

impl Chart<'_> {
    /// The chart as an SVG document.
    pub(crate) fn svg(&self) -> String {
        let buckets = self
            .algorithms
            .iter()
            .map(|(_, s)| s.len())
            .chain([self.offered.len()])
            .max()
            .unwrap_or(0)
            .max(1);
        let plot_w = WIDTH - LEFT - RIGHT;
        let x = |bucket: usize| LEFT + plot_w * bucket as f64 / buckets as f64;
        let first_panel = OFFERED_TOP + OFFERED_HEIGHT + PANEL_GAP;
        let bottom =
            first_panel + (PANEL_HEIGHT + PANEL_GAP) * self.algorithms.len() as f64 - PANEL_GAP;
        let height = bottom + 56.0;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12"><rect width="{WIDTH}" height="{height}" fill="#ffffff"/>"##
        );
        let window = format_time(self.window);
        let _ = writeln!(
            svg,
            r#"<title>Admitted units per {window} window, by algorithm, against L = {}</title><text x="{LEFT}" y="24" font-size="16" font-weight="bold">The most units one key had admitted in any {window} window, per algorithm (L = {})</text>"#,
            self.limit, self.limit
        );
        self.legend(&mut svg);

        // Time ticks, shared by every panel: grid lines through all, labels at the bottom.
        let span = buckets as u64 * self.bucket_width;
        let step = tick_step(span);
        let mut ticks = String::new();
        for tick in (0..=span).step_by(step as usize) {
            let tx = LEFT + plot_w * tick as f64 / span as f64;
            let _ = write!(
                ticks,
                r##"<line x1="{tx:.1}" y1="{OFFERED_TOP}" x2="{tx:.1}" y2="{bottom}" stroke="#eeeeee"/><text class="tick" x="{tx:.1}" y="{}" text-anchor="middle">{}</text>"##,
                bottom + 16.0,
                format_time(tick)
            );
        }
        let _ = writeln!(svg, "<g class=\"time-axis\">{ticks}</g>");
        let _ = writeln!(
            svg,
            r#"<text class="axis-label" x="{}" y="{}" text-anchor="middle">time since the trace's first request (one step per {})</text>"#,
            LEFT + plot_w / 2.0,
            bottom + 38.0,
            format_time(self.bucket_width)
        );

        // The offered load, per second, on its own scale.
        let seconds = self.bucket_width as f64 / 1e6;
        let offered: Vec<f64> = self.offered.iter().map(|&u| u as f64 / seconds).collect();
        let offered_top = nice_ceiling(offered.iter().copied().fold(1.0, f64::max));
        let oy = |v: f64| OFFERED_TOP + OFFERED_HEIGHT * (1.0 - v / offered_top);
        let _ = writeln!(
            svg,
            r#"<g class="panel" data-panel="offered"><text class="panel-title" x="{LEFT}" y="{}" font-weight="bold">offered load <tspan font-weight="normal">(every key)</tspan></text>{}{}<polygon class="series" data-series="offered" fill="{}" fill-opacity="0.6" points="{}"/></g>"#,
            OFFERED_TOP - 8.0,
            frame(OFFERED_TOP, OFFERED_HEIGHT),
            y_axis(
                &[(0.0, oy(0.0)), (offered_top, oy(offered_top))],
                "units/s",
                OFFERED_TOP,
                OFFERED_HEIGHT
            ),
            REFERENCE_COLOUR,
            area(&offered, &x, oy)
        );

        // The algorithms, on one shared y-scale that always shows the limit.
        let peak = self
            .algorithms
            .iter()
            .flat_map(|(_, s)| s.iter().copied())
            .max()
            .unwrap_or(0)
            .max(self.limit);
        let y_top = nice_ceiling(peak as f64 * 1.1);
        let reference: Vec<f64> = self
            .algorithms
            .first()
            .map_or(Vec::new(), |(_, s)| s.iter().map(|&v| v as f64).collect());
        for (index, (name, values)) in self.algorithms.iter().enumerate() {
            let top = first_panel + (PANEL_HEIGHT + PANEL_GAP) * index as f64;
            let y = |v: f64| top + PANEL_HEIGHT * (1.0 - v / y_top);
            let limit = self.limit as f64;
            let colour = COLOURS[index % COLOURS.len()];
            let values: Vec<f64> = values.iter().map(|&v| v as f64).collect();
            // Each run of steps over L is one region, between the limit line and the steps.
            let mut over = String::new();
            let mut bucket = 0;
            while bucket < values.len() {
                if values[bucket] <= limit {
                    bucket += 1;
                    continue;
                }
                let start = bucket;
                while bucket < values.len() && values[bucket] > limit {
                    bucket += 1;
                }
                let _ = write!(
                    over,
                    r#"<polygon class="over-limit" fill="{OVER_COLOUR}" fill-opacity="0.45" points="{:.1},{:.1} {} {:.1},{:.1}"/>"#,
                    x(start),
                    y(limit),
                    steps(&values[start..bucket], &|i| x(start + i), y),
                    x(bucket),
                    y(limit)
                );
            }
            let _ = writeln!(
                svg,
                r##"<g class="panel" data-panel="{name}"><text class="panel-title" x="{LEFT}" y="{}"><tspan font-weight="bold" fill="{colour}">{name}</tspan> {}</text>{}{}<polygon class="reference" fill="{REFERENCE_COLOUR}" fill-opacity="0.35" points="{}"/>{over}<line class="limit" x1="{LEFT}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="{LIMIT_COLOUR}" stroke-width="1.2" stroke-dasharray="6 3"/><polyline class="series" data-series="{name}" fill="none" stroke="{colour}" stroke-width="1.3" points="{}"/></g>"##,
                top - 8.0,
                self.verdict(&values),
                frame(top, PANEL_HEIGHT),
                y_axis(
                    &[(0.0, y(0.0)), (limit, y(limit)), (y_top, y(y_top))],
                    &format!("units in {window}, one key"),
                    top,
                    PANEL_HEIGHT
                ),
                area(&reference, &x, y),
                y(limit),
                WIDTH - RIGHT,
                y(limit),
                steps(&values, &x, y)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }

    /// The panel's one-line summary: its peak, and how often it went over L.
    fn verdict(&self, values: &[f64]) -> String {
        let limit = self.limit as f64;
        let peak = values.iter().copied().fold(0.0, f64::max);
        let over = values.iter().filter(|&&v| v > limit).count();
        if over == 0 {
            return format!("— never over L (peak {peak})");
        }
        let at = values.iter().position(|&v| v == peak).unwrap_or(0) as u64;
        format!(
            r#"— <tspan fill="{LIMIT_COLOUR}">over L in {over} of {} steps, peak {peak} ({:.2} × L) at {}</tspan>"#,
            values.len(),
            peak / limit,
            format_time(at * self.bucket_width)
        )
    }

    fn legend(&self, svg: &mut String) {
        let line = |style: &str| format!(r#"<line x1="0" y1="0" x2="22" y2="0" {style}/>"#);
        let block = |style: &str| format!(r#"<rect x="0" y="-6" width="22" height="12" {style}/>"#);
        let items = [
            (
                line(&format!(r#"stroke="{}" stroke-width="1.5""#, COLOURS[1])),
                "the panel's algorithm".to_owned(),
            ),
            (
                block(&format!(r#"fill="{REFERENCE_COLOUR}" fill-opacity="0.35""#)),
                "exact sliding log (reference)".to_owned(),
            ),
            (
                line(&format!(
                    r#"stroke="{LIMIT_COLOUR}" stroke-dasharray="6 3""#
                )),
                format!("limit L = {}", self.limit),
            ),
            (
                block(&format!(r#"fill="{OVER_COLOUR}" fill-opacity="0.45""#)),
                "admitted over L".to_owned(),
            ),
        ];
        let mut lx = LEFT;
        svg.push_str("<g class=\"legend\">");
        for (swatch, label) in &items {
            let _ = write!(
                svg,
                r#"<g transform="translate({lx},52)">{swatch}<text x="28" y="4">{label}</text></g>"#
            );
            lx += 48.0 + 6.5 * label.chars().count() as f64;
        }
        svg.push_str("</g>\n");
    }
}

/// A panel's border.
fn frame(top: f64, height: f64) -> String {
    format!(
        r##"<rect class="frame" x="{LEFT}" y="{top}" width="{}" height="{height}" fill="none" stroke="#616161"/>"##,
        WIDTH - LEFT - RIGHT
    )
}

/// Tick labels at `(value, y)` and the axis's label, rotated along it.
fn y_axis(ticks: &[(f64, f64)], label: &str, top: f64, height: f64) -> String {
    let mut axis = String::new();
    for (value, ty) in ticks {
        let _ = write!(
            axis,
            r#"<text class="tick" x="{}" y="{:.1}" text-anchor="end">{value}</text>"#,
            LEFT - 4.0,
            ty + 4.0
        );
    }
    let (lx, ly) = (LEFT - 48.0, top + height / 2.0);
    let _ = write!(
        axis,
        r#"<text class="axis-label" x="{lx}" y="{ly}" text-anchor="middle" font-size="11" transform="rotate(-90 {lx} {ly})">{label}</text>"#
    );
    axis
}

/// A step line: each bucket's value held across its width.
fn steps(values: &[f64], x: &impl Fn(usize) -> f64, y: impl Fn(f64) -> f64) -> String {
    let mut points = String::new();
    for (bucket, &v) in values.iter().enumerate() {
        let _ = write!(
            points,
            "{:.1},{:.1} {:.1},{:.1} ",
            x(bucket),
            y(v),
            x(bucket + 1),
            y(v)
        );
    }
    points.trim_end().to_owned()
}

/// The region under a step line, down to 0.
fn area(values: &[f64], x: &impl Fn(usize) -> f64, y: impl Fn(f64) -> f64) -> String {
    format!(
        "{:.1},{:.1} {} {:.1},{:.1}",
        x(0),
        y(0.0),
        steps(values, x, &y),
        x(values.len()),
        y(0.0)
    )
}

/// The smallest round number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 × 10ⁿ) at or above
/// `value`: an axis's top.
fn nice_ceiling(value: f64) -> f64 {
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&nice| nice >= value)
        .unwrap_or(10.0 * magnitude)
}

/// A round time step giving at most ten ticks over `span` µs.
fn tick_step(span: u64) -> u64 {
    const STEPS: [u64; 16] = [
        1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400,
    ];
    let seconds = STEPS
        .iter()
        .copied()
        .find(|step| span / (step * 1_000_000) <= 10)
        .unwrap_or(span.div_ceil(10 * 1_000_000).max(1));
    seconds * 1_000_000
}

/// µs as a clock-like duration: `0`, `45s`, `2m`, `1h30m`, `2.5s` below a minute.
fn format_time(micros: u64) -> String {
    let seconds = micros / 1_000_000;
    let (hours, minutes, secs) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if micros == 0 {
        return "0".into();
    }
    if seconds < 60 && !micros.is_multiple_of(1_000_000) {
        let fraction = format!("{:.2}", micros as f64 / 1e6);
        return format!("{}s", fraction.trim_end_matches('0').trim_end_matches('.'));
    }
    let mut text = String::new();
    for (n, unit) in [(hours, "h"), (minutes, "m"), (secs, "s")] {
        if n > 0 {
            let _ = write!(text, "{n}{unit}");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_clock_durations() {
        assert_eq!(format_time(0), "0");
        assert_eq!(format_time(90_000_000), "1m30s");
        assert_eq!(format_time(3_600_000_000), "1h");
        assert_eq!(format_time(3_000_000), "3s");
        assert_eq!(format_time(2_500_000), "2.5s");
        assert_eq!(format_time(2_705_998), "2.71s");
        assert_eq!(tick_step(600_000_000), 60_000_000);
        assert_eq!(nice_ceiling(220.0), 250.0);
        assert_eq!(nice_ceiling(110.0), 120.0);
        assert_eq!(nice_ceiling(100.0), 100.0);
    }
}
