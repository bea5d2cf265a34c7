//! The AIPerf-style table the replay CLI prints to stdout (replay.md §11).
//!
//! Users compare this output with the reference CLI by eye and by diff, so layout and number
//! formatting follow the reference's hand-drawn table: heavy `┃` separators on every row
//! (header and body) and `━` in every horizontal rule, bottom included. This is not rich's
//! HEAVY_HEAD box (light `│`/`─` in the body), which real AIPerf uses. Two deliberate
//! differences: the title is mocker's own ([`TITLE`]), and the reference closes the table
//! with light corners and joints on its heavy rule (`└ ━ ┴ ┘`), a mix that renders as a
//! broken border; ours is all heavy (`┗ ━ ┻ ┛`).

use std::fmt::Write as _;

use super::stats::DistSummary;
use super::summary::Summary;

/// Title line printed above the table. The reference prints "NVIDIA AIPerf | LLM Metrics",
/// but these figures are simulated by mocker, not measured by AIPerf.
pub const TITLE: &str = "mocker | LLM Metrics";

/// Header row; the stat columns are a fixed subset (no p50/p95) in this order.
const HEADERS: [&str; 8] = ["Metric", "avg", "min", "max", "p99", "p90", "p75", "std"];

const NOT_AVAILABLE: &str = "N/A";

/// Formats like Python's `f"{value:,.2f}"`: two decimals, comma thousands separators.
///
/// Rust's `{:.2}` rounds the exact binary value half-to-even, as Python does, so only the
/// grouping and the spelling of NaN need adjusting.
pub fn format_number(value: f64) -> String {
    if value.is_nan() {
        return "nan".to_string();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    let plain = format!("{value:.2}");
    let (sign, unsigned) = match plain.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", plain.as_str()),
    };
    let (int_part, frac_part) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let mut out = String::with_capacity(plain.len() + int_part.len() / 3);
    out.push_str(sign);
    for (i, digit) in int_part.chars().enumerate() {
        if i > 0 && (int_part.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out.push('.');
    out.push_str(frac_part);
    out
}

fn stat_row(label: &str, d: &DistSummary) -> Vec<String> {
    let mut row = vec![label.to_string()];
    row.extend([d.mean, d.min, d.max, d.p99, d.p90, d.p75, d.std].map(format_number));
    row
}

fn scalar_row(label: &str, value: f64) -> Vec<String> {
    let mut row = vec![label.to_string(), format_number(value)];
    row.extend(std::iter::repeat_n(NOT_AVAILABLE.to_string(), HEADERS.len() - 2));
    row
}

fn rows(summary: &Summary) -> Vec<Vec<String>> {
    vec![
        stat_row("Time to First Token (ms)", &summary.ttft_ms),
        stat_row("Time to Second Token (ms)", &summary.ttst_ms),
        stat_row("Request Latency (ms)", &summary.e2e_latency_ms),
        stat_row("Inter Token Latency (ms)", &summary.itl_ms),
        stat_row(
            "Output Token Throughput Per User (tokens/sec/user)",
            &summary.output_token_throughput_per_user,
        ),
        scalar_row("Output Token Throughput (tokens/sec)", summary.output_throughput_tok_s),
        scalar_row("Request Throughput (requests/sec)", summary.request_throughput_rps),
        scalar_row("Request Count (requests)", summary.completed_requests as f64),
    ]
}

fn rule(out: &mut String, widths: &[usize], [left, mid, right]: [char; 3]) {
    out.push(left);
    for (i, &width) in widths.iter().enumerate() {
        if i > 0 {
            out.push(mid);
        }
        out.extend(std::iter::repeat_n('━', width + 2));
    }
    out.push(right);
    out.push('\n');
}

fn cells(out: &mut String, widths: &[usize], row: &[String]) {
    out.push('┃');
    for (i, (cell, &width)) in row.iter().zip(widths).enumerate() {
        // Metric names read left-aligned; numbers right-align so decimal points line up.
        let _ = if i == 0 { write!(out, " {cell:<width$} ┃") } else { write!(out, " {cell:>width$} ┃") };
    }
    out.push('\n');
}

/// Renders the stdout report: title, table, wall time and cache-reuse lines, then
/// `Saved full report to: <path>` when a report file was written.
///
/// Every line, the last included, ends with `\n`, so the result can be printed as is.
pub fn render_table(summary: &Summary, report_path: Option<&str>) -> String {
    let header: Vec<String> = HEADERS.iter().map(|h| h.to_string()).collect();
    let body = rows(summary);
    let mut widths: Vec<usize> = HEADERS.iter().map(|h| h.chars().count()).collect();
    for row in &body {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }

    let mut out = String::new();
    out.push_str(TITLE);
    out.push('\n');
    rule(&mut out, &widths, ['┏', '┳', '┓']);
    cells(&mut out, &widths, &header);
    rule(&mut out, &widths, ['┡', '╇', '┩']);
    for row in &body {
        cells(&mut out, &widths, row);
    }
    rule(&mut out, &widths, ['┗', '┻', '┛']);
    let _ = writeln!(out, "Wall Time (ms): {}", format_number(summary.wall_time_ms));
    let _ = writeln!(out, "Prefix Cache Reused Ratio: {}", format_number(summary.prefix_cache_reused_ratio));
    let _ = writeln!(
        out,
        "First Admission Prefix Cache Reused Ratio: {}",
        format_number(summary.first_admission_prefix_cache_reused_ratio)
    );
    // The reference prints no goodput at all; a line after its table keeps the table
    // itself diffable against the reference's while the SLA outcome is readable at a glance.
    if let (Some(good), Some(rps)) =
        (summary.goodput_completed_requests, summary.goodput_request_throughput_rps)
    {
        let _ = writeln!(
            out,
            "Goodput (requests/sec): {} ({} of {} completed requests within the SLA)",
            format_number(rps),
            good,
            summary.completed_requests
        );
    }
    if let Some(path) = report_path {
        let _ = writeln!(out, "Saved full report to: {path}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::summary::SummaryInputs;

    #[test]
    fn number_format_matches_python() {
        let cases = [
            (0.0, "0.00"),
            (1234567.891, "1,234,567.89"),
            (-1234.5, "-1,234.50"),
            (-0.0, "-0.00"),
            (0.005, "0.01"), // binary value is slightly above 0.005
            (0.125, "0.12"), // exact tie: half to even
            (0.375, "0.38"), // exact tie: half to even
            (1.005, "1.00"), // binary value is slightly below 1.005
            (999.995, "1,000.00"),
            (100.0, "100.00"),
            (123456.0, "123,456.00"),
            (-999999.999, "-1,000,000.00"),
            (1e21, "1,000,000,000,000,000,000,000.00"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for (value, expected) in cases {
            assert_eq!(format_number(value), expected, "{value}");
        }
    }

    fn sample_summary() -> Summary {
        let mut s = Summary::from_inputs(SummaryInputs {
            num_requests: 1200,
            completed_requests: 1187,
            total_input_tokens: 1_000_000,
            total_output_tokens: 118_700,
            reused_input_tokens: 497_500,
            first_admission_reused_input_tokens: 480_000,
            duration_ms: 74_532.25,
            wall_time_ms: 2_481.5,
            ..SummaryInputs::default()
        });
        let dist = |mean, min, max, p99, p90, p75, std| DistSummary {
            mean,
            min,
            max,
            median: 0.0,
            p75,
            p90,
            p95: 0.0,
            p99,
            std,
        };
        s.ttft_ms = dist(367.78, 90.16, 1_371.36, 1_371.36, 520.5, 400.25, 210.125);
        s.ttst_ms = dist(85.16, 5.95, 171.06, 171.06, 171.06, 171.06, 81.87);
        s.e2e_latency_ms = dist(12_982.7, 679.8, 21_153.74, 21_153.74, 988.84, 988.84, 80.53);
        s.itl_ms = dist(18.6905, 5.95, 171.1, 6.64, 6.63, 6.61, 15.58);
        s.output_token_throughput_per_user = dist(150.79, 5.84, 168.18, 168.17, 152.48, 152.17, -0.0);
        s
    }

    /// Expected output, checked against the reference CLI's table code fed this summary (its
    /// title aside: the reference prints "NVIDIA AIPerf | LLM Metrics").
    const SNAPSHOT: [&str; 17] = [
        "mocker | LLM Metrics",
        "┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━┓",
        "┃ Metric                                             ┃       avg ┃    min ┃       max ┃       p99 ┃    p90 ┃    p75 ┃    std ┃",
        "┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━┩",
        "┃ Time to First Token (ms)                           ┃    367.78 ┃  90.16 ┃  1,371.36 ┃  1,371.36 ┃ 520.50 ┃ 400.25 ┃ 210.12 ┃",
        "┃ Time to Second Token (ms)                          ┃     85.16 ┃   5.95 ┃    171.06 ┃    171.06 ┃ 171.06 ┃ 171.06 ┃  81.87 ┃",
        "┃ Request Latency (ms)                               ┃ 12,982.70 ┃ 679.80 ┃ 21,153.74 ┃ 21,153.74 ┃ 988.84 ┃ 988.84 ┃  80.53 ┃",
        "┃ Inter Token Latency (ms)                           ┃     18.69 ┃   5.95 ┃    171.10 ┃      6.64 ┃   6.63 ┃   6.61 ┃  15.58 ┃",
        "┃ Output Token Throughput Per User (tokens/sec/user) ┃    150.79 ┃   5.84 ┃    168.18 ┃    168.17 ┃ 152.48 ┃ 152.17 ┃  -0.00 ┃",
        "┃ Output Token Throughput (tokens/sec)               ┃  1,592.60 ┃    N/A ┃       N/A ┃       N/A ┃    N/A ┃    N/A ┃    N/A ┃",
        "┃ Request Throughput (requests/sec)                  ┃     15.93 ┃    N/A ┃       N/A ┃       N/A ┃    N/A ┃    N/A ┃    N/A ┃",
        "┃ Request Count (requests)                           ┃  1,187.00 ┃    N/A ┃       N/A ┃       N/A ┃    N/A ┃    N/A ┃    N/A ┃",
        "┗━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┻━━━━━━━━━━━┻━━━━━━━━┻━━━━━━━━━━━┻━━━━━━━━━━━┻━━━━━━━━┻━━━━━━━━┻━━━━━━━━┛",
        "Wall Time (ms): 2,481.50",
        "Prefix Cache Reused Ratio: 0.50",
        "First Admission Prefix Cache Reused Ratio: 0.48",
        "Saved full report to: /tmp/report.json",
    ];

    #[test]
    fn table_snapshot() {
        let text = render_table(&sample_summary(), Some("/tmp/report.json"));
        assert!(text.ends_with('\n'));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines, SNAPSHOT);
        // Every table line (borders, header, rows) has the same display width.
        let width = lines[1].chars().count();
        assert!(lines[1..13].iter().all(|l| l.chars().count() == width));
    }

    /// With an SLA the goodput follows the reuse lines and the table is unchanged.
    #[test]
    fn goodput_line_only_with_an_sla() {
        let mut s = sample_summary();
        s.goodput_completed_requests = Some(1000);
        s.goodput_request_throughput_rps = Some(13.4174);
        let text = render_table(&s, Some("/tmp/report.json"));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[..16], SNAPSHOT[..16]);
        assert_eq!(
            lines[16],
            "Goodput (requests/sec): 13.42 (1000 of 1187 completed requests within the SLA)"
        );
        assert_eq!(lines[17], SNAPSHOT[16]);
        assert!(!render_table(&sample_summary(), None).contains("Goodput"));
    }

    #[test]
    fn report_path_line_is_optional() {
        let text = render_table(&sample_summary(), None);
        assert_eq!(text.lines().count(), SNAPSHOT.len() - 1);
        assert!(text.ends_with("First Admission Prefix Cache Reused Ratio: 0.48\n"));
    }
}
