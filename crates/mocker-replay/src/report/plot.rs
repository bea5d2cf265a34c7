//! SVG charts of a replay (`--plot DIR`): TTFT and ITL CDFs, output-token throughput and
//! queue depth over simulated time, and per-worker prefix-cache hit rate. Each chart names
//! the run under its title, since the files are often looked at apart from the report.
//!
//! [`PlotData`] folds per-request records into bounded state as they end (samples are
//! thinned and time series re-bucketed as they grow), so plotting a million requests
//! costs memory of a fixed size. Rendering returns SVG text; the caller decides where and
//! how (atomically) to write it.

use plotters::prelude::*;

use crate::scaling::PoolName;

use crate::request_log::RequestRecord;

/// Most samples a CDF keeps; beyond it every other sample is dropped, deterministically.
const MAX_SAMPLES: usize = 200_000;
/// Most points a drawn CDF has.
const CDF_POINTS: usize = 1_000;
/// Most buckets a time series keeps; beyond it neighbours merge and the width doubles.
const MAX_BUCKETS: usize = 1_000;

/// Samples thinned to a bound: keeps every `stride`-th value offered.
#[derive(Debug, Default)]
struct Thinned {
    values: Vec<f64>,
    stride: u64,
    seen: u64,
}

impl Thinned {
    fn push(&mut self, v: f64) {
        let stride = self.stride.max(1);
        if self.seen.is_multiple_of(stride) {
            self.values.push(v);
            if self.values.len() >= MAX_SAMPLES {
                let mut i = 0u32;
                self.values.retain(|_| {
                    i += 1;
                    !i.is_multiple_of(2)
                });
                self.stride = stride * 2;
            }
        }
        self.seen += 1;
    }

    fn sorted(&self) -> Vec<f64> {
        let mut v = self.values.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    /// (value, fraction of samples at or below it), for a CDF drawn with at most
    /// [`CDF_POINTS`] points (more would only bloat the SVG).
    fn cdf(&self) -> Vec<(f64, f64)> {
        cdf_of(&self.sorted())
    }

    /// The CDF up to the `q` quantile and that quantile (`None` without samples): a long
    /// tail otherwise squeezes the body of the curve into a vertical line at the left.
    fn cdf_clipped(&self, q: f64) -> (Vec<(f64, f64)>, Option<f64>) {
        let v = self.sorted();
        if v.is_empty() {
            return (Vec::new(), None);
        }
        // Nearest rank: the smallest sample with at least a fraction q at or below it.
        let rank = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len());
        let clip = v[rank - 1];
        let points = cdf_of(&v).into_iter().filter(|p| p.0 <= clip).collect();
        (points, Some(clip))
    }
}

/// The CDF points of `v`, sorted ascending.
fn cdf_of(v: &[f64]) -> Vec<(f64, f64)> {
    let n = v.len();
    let step = n.div_ceil(CDF_POINTS).max(1);
    let mut points: Vec<(f64, f64)> =
        (step - 1..n).step_by(step).map(|i| (v[i], (i + 1) as f64 / n as f64)).collect();
    if n > 0 && points.last().map(|p| p.1) != Some(1.0) {
        points.push((v[n - 1], 1.0));
    }
    points
}

/// Sums over fixed-width simulated-time buckets that widen as the run gets longer.
#[derive(Debug)]
struct Series {
    width_ms: f64,
    sums: Vec<f64>,
}

impl Default for Series {
    fn default() -> Self {
        Self { width_ms: 10.0, sums: Vec::new() }
    }
}

impl Series {
    fn add(&mut self, t_ms: f64, v: f64) {
        let mut i = (t_ms / self.width_ms) as usize;
        while i >= MAX_BUCKETS {
            let merged: Vec<f64> = self.sums.chunks(2).map(|c| c.iter().sum()).collect();
            self.sums = merged;
            self.width_ms *= 2.0;
            i = (t_ms / self.width_ms) as usize;
        }
        if self.sums.len() <= i {
            self.sums.resize(i + 1, 0.0);
        }
        self.sums[i] += v;
    }
}

/// What the charts need, folded from per-request records as they end.
#[derive(Debug, Default)]
pub struct PlotData {
    ttft_ms: Thinned,
    itl_ms: Thinned,
    /// Output tokens per time bucket.
    tokens: Series,
    /// +1 at arrival, -1 at admission (or at the end of a request never admitted).
    queue_delta: Series,
}

/// One chart: its file name and SVG text.
pub type Chart = (&'static str, String);

/// What the charts show besides the folded records.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// Per worker of the pool requests enter: (input tokens, cached tokens).
    pub worker_tokens: &'a [(u64, u64)],
    /// The run, one line under every chart's title (empty: none).
    pub subtitle: &'a str,
    /// The pool those workers form, naming bars by pool and index ("prefill 0"); `None`
    /// for aggregated workers, named by index.
    pub worker_pool: Option<&'a str>,
    /// A scaled run's worker counts and its end (ms): one `workers_<pool>.svg` per pool.
    pub worker_counts: Option<(&'a super::WorkerCounts, f64)>,
}

/// The fraction of inter-token gaps the ITL chart's x axis covers.
const ITL_CLIP: f64 = 0.99;

impl PlotData {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one finished request in.
    pub fn add(&mut self, r: &RequestRecord) {
        if let Some(first) = r.first_token_ms {
            self.ttft_ms.push(first - r.arrival_ms);
        }
        for w in r.token_times_ms.windows(2) {
            self.itl_ms.push(w[1] - w[0]);
        }
        for &t in &r.token_times_ms {
            self.tokens.add(t, 1.0);
        }
        self.queue_delta.add(r.arrival_ms, 1.0);
        let left_queue = r.admission_ms.or(r.token_times_ms.last().copied()).unwrap_or(r.arrival_ms);
        self.queue_delta.add(left_queue, -1.0);
    }

    /// Renders every chart.
    pub fn render(&self, o: &RenderOptions<'_>) -> Result<Vec<Chart>, String> {
        let tokens = self.tokens_per_second();
        let queue = self.queue_depth();
        let hit: Vec<f64> =
            o.worker_tokens.iter().map(|&(i, c)| if i == 0 { 0.0 } else { c as f64 / i as f64 }).collect();
        let labels = |title: &'static str, x: String, y: &'static str| Labels {
            title: title.into(),
            subtitle: o.subtitle,
            x,
            y,
        };
        let (itl, clip) = self.itl_ms.cdf_clipped(ITL_CLIP);
        let itl_x = match clip {
            Some(c) => format!("inter-token latency (ms), clipped at p99 = {c:.2} ms"),
            None => "inter-token latency (ms)".into(),
        };
        let (bar_title, bar_x, bar_names): (String, String, Vec<String>) = match o.worker_pool {
            Some(pool) => (
                format!("Prefix-cache hit rate per {pool} worker"),
                format!("{pool} worker"),
                (0..hit.len()).map(|i| format!("{pool} {i}")).collect(),
            ),
            None => (
                "Prefix-cache hit rate per worker".to_string(),
                "worker".to_string(),
                (0..hit.len()).map(|i| i.to_string()).collect(),
            ),
        };
        let bars = Labels { title: bar_title, subtitle: o.subtitle, x: bar_x, y: "hit rate (%)" };
        let mut charts = vec![
            (
                "ttft_cdf.svg",
                line_chart(
                    &labels("TTFT CDF", "TTFT (ms)".into(), "fraction of requests"),
                    &self.ttft_ms.cdf(),
                )?,
            ),
            ("itl_cdf.svg", itl_chart(&labels("ITL CDF", itl_x, "fraction of gaps"), &itl)?),
            (
                "throughput.svg",
                line_chart(&labels("Output throughput", "simulated time (s)".into(), "tokens/s"), &tokens)?,
            ),
            (
                "queue_depth.svg",
                count_chart(&labels("Queue depth", "simulated time (s)".into(), "requests waiting"), &queue)?,
            ),
            ("worker_cache_hit_rate.svg", bar_chart(&bars, &hit, &bar_names)?),
        ];
        if let Some((counts, end_ms)) = o.worker_counts {
            for (i, (pool, _)) in counts.pools.iter().enumerate() {
                let (file, title) = match pool {
                    PoolName::Agg => ("workers_agg.svg", "Active workers"),
                    PoolName::Prefill => ("workers_prefill.svg", "Active prefill workers"),
                    PoolName::Decode => ("workers_decode.svg", "Active decode workers"),
                };
                let l = labels(title, "simulated time (s)".into(), "workers");
                charts.push((file, count_chart(&l, &counts.step_points(i, end_ms))?));
            }
        }
        Ok(charts)
    }

    fn tokens_per_second(&self) -> Vec<(f64, f64)> {
        let w = self.tokens.width_ms;
        self.tokens
            .sums
            .iter()
            .enumerate()
            .map(|(i, &n)| ((i as f64 + 0.5) * w / 1e3, n / (w / 1e3)))
            .collect()
    }

    /// Requests waiting at the end of each bucket.
    fn queue_depth(&self) -> Vec<(f64, f64)> {
        let w = self.queue_delta.width_ms;
        let mut depth = 0.0;
        self.queue_delta
            .sums
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                depth += d;
                ((i + 1) as f64 * w / 1e3, depth)
            })
            .collect()
    }
}

const SIZE: (u32, u32) = (800, 500);

/// A chart's words.
struct Labels<'a> {
    title: String,
    /// The run, under the title.
    subtitle: &'a str,
    x: String,
    y: &'a str,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// The chart's canvas: white, with the title and the run's subtitle drawn on top; returns
/// the area left for the chart.
fn canvas<'a>(root: Area<'a>, labels: &Labels<'_>) -> Result<Area<'a>, String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut area = root.titled(&labels.title, ("sans-serif", 22)).map_err(|e| e.to_string())?;
    if !labels.subtitle.is_empty() {
        let style = ("sans-serif", 14).into_font().color(&RGBColor(80, 80, 80));
        area = area.titled(labels.subtitle, style).map_err(|e| e.to_string())?;
    }
    Ok(area)
}

/// Axis range covering `values` with a little headroom; never empty.
fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let lo = lo.min(0.0);
    let hi = if hi > lo { hi + (hi - lo) * 0.05 } else { lo + 1.0 };
    lo..hi
}

/// Most labels on an axis (plotters' own default).
const MAX_LABELS: usize = 10;

/// Labels an axis only at whole numbers: `v` printed without decimals, other positions blank.
fn whole(v: &f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        String::new()
    }
}

fn line_chart(labels: &Labels<'_>, points: &[(f64, f64)]) -> Result<String, String> {
    let x = range(points.iter().map(|p| p.0));
    let y = range(points.iter().map(|p| p.1));
    line_chart_in(labels, points, x, y, None)
}

/// A CDF whose x axis spans the samples shown, not from 0: inter-token gaps sit in a narrow
/// band far from 0, which an axis from 0 squeezes into a sliver at the right.
fn itl_chart(labels: &Labels<'_>, points: &[(f64, f64)]) -> Result<String, String> {
    let (lo, hi) = match (points.first(), points.last()) {
        (Some(a), Some(b)) => (a.0, b.0),
        _ => return line_chart(labels, points),
    };
    let pad = if hi > lo { (hi - lo) * 0.05 } else { hi.abs().max(1.0) * 0.05 };
    let x = (lo - pad).max(0.0)..hi + pad;
    line_chart_in(labels, points, x, range(points.iter().map(|p| p.1)), None)
}

/// A line chart of whole counts: the y axis ends at a whole number and is labelled only at
/// whole numbers (plotters would put ticks at 0.5 steps on a range of a few units).
fn count_chart(labels: &Labels<'_>, points: &[(f64, f64)]) -> Result<String, String> {
    let y = range(points.iter().map(|p| p.1));
    let y = y.start.floor()..y.end.ceil();
    // A label per unit while that is few enough; plotters' steps above one unit (2, 5,
    // 10, ...) are whole anyway.
    let whole_labels = ((y.end - y.start) as usize + 1).min(MAX_LABELS + 1);
    line_chart_in(labels, points, range(points.iter().map(|p| p.0)), y, Some(whole_labels))
}

/// `whole_y_labels`: label the y axis at whole numbers only, with this many labels at most.
fn line_chart_in(
    labels: &Labels<'_>,
    points: &[(f64, f64)],
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    whole_y_labels: Option<usize>,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let area = canvas(root.clone(), labels)?;
        let mut chart = ChartBuilder::on(&area)
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(x, y)
            .map_err(|e| e.to_string())?;
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(labels.x.as_str()).y_desc(labels.y);
        if let Some(n) = whole_y_labels {
            mesh.y_labels(n).y_label_formatter(&whole);
        }
        mesh.draw().map_err(|e| e.to_string())?;
        chart
            .draw_series(LineSeries::new(points.iter().copied(), BLUE.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// Bars of rates in [0, 1], the i-th named `names[i]`.
fn bar_chart(labels: &Labels<'_>, values: &[f64], names: &[String]) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let area = canvas(root.clone(), labels)?;
        // Rates: the whole 0-100% scale, so charts of different runs compare at a glance.
        let top = 1.0;
        let mut chart = ChartBuilder::on(&area)
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(65)
            .build_cartesian_2d(-0.5..(values.len() as f64 - 0.5).max(0.5), 0.0..top)
            .map_err(|e| e.to_string())?;
        // Workers are whole numbers: at most one label per worker (plotters would otherwise
        // split a short axis at 0.5 steps), and only at whole positions; no vertical grid
        // lines between bars.
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(values.len().clamp(1, MAX_LABELS))
            .x_label_formatter(&|v| {
                let name = (v.fract() == 0.0 && *v >= 0.0).then(|| names.get(*v as usize)).flatten();
                name.cloned().unwrap_or_default()
            })
            .y_label_formatter(&|v| format!("{:.0}", v * 100.0))
            .x_desc(labels.x.as_str())
            .y_desc(labels.y)
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(values.iter().enumerate().map(|(i, &v)| {
                let x = i as f64;
                Rectangle::new([(x - 0.35, 0.0), (x + 0.35, v)], BLUE.filled())
            }))
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(arrival: f64, admission: f64, tokens: &[f64]) -> RequestRecord {
        RequestRecord {
            request_index: 0,
            status: "completed",
            worker: 0,
            arrival_ms: arrival,
            admission_ms: Some(admission),
            first_token_ms: tokens.first().copied(),
            token_times_ms: tokens.to_vec(),
            input_tokens: 10,
            output_tokens: tokens.len() as u32,
            cached_tokens: 0,
            ..Default::default()
        }
    }

    #[test]
    fn series_fold_records_and_stay_bounded() {
        let mut p = PlotData::new();
        p.add(&record(0.0, 5.0, &[20.0, 25.0, 31.0]));
        p.add(&record(1.0, 30.0, &[40.0, 44.0]));
        assert_eq!(p.ttft_ms.cdf(), vec![(20.0, 0.5), (39.0, 1.0)]);
        assert_eq!(p.itl_ms.cdf().iter().map(|x| x.0).collect::<Vec<_>>(), vec![4.0, 5.0, 6.0]);
        // Both wait in the first bucket; the second leaves at 30 ms.
        let q = p.queue_depth();
        assert_eq!((q[0].1, q[2].1, q[3].1), (1.0, 1.0, 0.0));
        assert_eq!(p.tokens.sums.iter().sum::<f64>(), 5.0);
        // A long run re-buckets instead of growing.
        p.add(&record(1e7, 1e7, &[2e7]));
        assert!(p.tokens.sums.len() <= MAX_BUCKETS && p.tokens.sums.iter().sum::<f64>() == 6.0);
        let mut t = Thinned::default();
        (0..3 * MAX_SAMPLES).for_each(|i| t.push(i as f64));
        assert!(t.values.len() < MAX_SAMPLES && t.values.len() > MAX_SAMPLES / 4);
        let cdf = t.cdf();
        assert!(cdf.len() <= CDF_POINTS + 1 && cdf.last().unwrap().1 == 1.0);
        assert!(cdf.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    }

    #[test]
    fn every_chart_renders_as_svg() {
        let mut p = PlotData::new();
        p.add(&record(0.0, 0.0, &[10.0, 12.0]));
        let charts =
            p.render(&RenderOptions { worker_tokens: &[(100, 40), (100, 0)], ..Default::default() }).unwrap();
        assert_eq!(charts.len(), 5);
        for (name, svg) in &charts {
            assert!(name.ends_with(".svg") && svg.starts_with("<svg") && svg.contains("</svg>"), "{name}");
        }
        // The empty case (nothing finished) still renders.
        assert!(PlotData::new().render(&RenderOptions::default()).is_ok());
    }

    /// The numeric tick labels of a chart as (x, y, text), in drawing order (plotters draws
    /// the y axis's labels first).
    fn tick_labels(svg: &str) -> Vec<(String, String, String)> {
        let flat = svg.replace('\n', "");
        flat.split("<text x=\"")
            .skip(1)
            .filter_map(|t| {
                let (x, rest) = t.split_once('"')?;
                let y = rest.split_once("y=\"")?.1.split_once('"')?.0;
                let text = rest.split_once('>')?.1.split_once('<')?.0.trim();
                text.parse::<f64>().ok().map(|_| (x.to_string(), y.to_string(), text.to_string()))
            })
            .collect()
    }

    /// Workers and waiting requests are whole numbers, and so are their axis labels, even
    /// on an axis only a couple of units long (plotters would tick it at halves).
    #[test]
    fn counts_are_labelled_with_whole_numbers() {
        let mut p = PlotData::new();
        p.add(&record(0.0, 5.0, &[20.0, 25.0, 31.0]));
        p.add(&record(1.0, 30.0, &[40.0, 44.0]));
        let charts =
            p.render(&RenderOptions { worker_tokens: &[(100, 40), (100, 0)], ..Default::default() }).unwrap();
        let svg = |name: &str| &charts.iter().find(|c| c.0 == name).unwrap().1;
        let bars = tick_labels(svg("worker_cache_hit_rate.svg"));
        let y_axis_x = &bars[0].0;
        let x_labels: Vec<&str> = bars.iter().filter(|l| &l.0 != y_axis_x).map(|l| l.2.as_str()).collect();
        assert_eq!(x_labels, ["0", "1"], "{bars:?}");
        let y_labels: Vec<&str> = bars.iter().filter(|l| &l.0 == y_axis_x).map(|l| l.2.as_str()).collect();
        assert_eq!(y_labels.first().zip(y_labels.last()), Some((&"0", &"100")), "percent: {bars:?}");
        let queue = tick_labels(svg("queue_depth.svg"));
        let y_axis_x = &queue[0].0;
        let depth: Vec<&str> = queue.iter().filter(|l| &l.0 == y_axis_x).map(|l| l.2.as_str()).collect();
        assert!(depth.len() >= 2 && depth.iter().all(|d| !d.contains('.')), "{queue:?}");
    }

    /// The text of every `<text>` element of a chart.
    fn texts(svg: &str) -> Vec<String> {
        let flat = svg.replace('\n', "");
        let texts = flat.split("<text").skip(1).filter_map(|t| t.split_once('>')?.1.split_once("</text>"));
        texts.map(|(text, _)| text.trim().to_string()).collect()
    }

    #[test]
    fn every_chart_names_the_run_under_its_title() {
        let mut p = PlotData::new();
        p.add(&record(0.0, 0.0, &[10.0, 12.0]));
        let subtitle = "2 workers, router kv, vllm, timing: polynomial (reference fit)";
        let charts = p
            .render(&RenderOptions { worker_tokens: &[(100, 40), (100, 0)], subtitle, ..Default::default() })
            .unwrap();
        for (name, svg) in &charts {
            let t = texts(svg);
            let title = t.iter().position(|x| !x.is_empty()).unwrap();
            assert_eq!(t.get(title + 1).map(String::as_str), Some(subtitle), "{name}: {t:?}");
        }
    }

    /// One slow gap in a hundred does not set the axis: it ends near the p99 and says so.
    #[test]
    fn itl_axis_is_clipped_at_the_p99() {
        let mut p = PlotData::new();
        let mut times = vec![0.0];
        for i in 1..=200 {
            let gap = if i % 100 == 0 { 1000.0 } else { 5.0 + (i % 7) as f64 };
            times.push(times[i - 1] + gap);
        }
        p.add(&record(0.0, 0.0, &times));
        let charts = p.render(&RenderOptions::default()).unwrap();
        let svg = &charts.iter().find(|c| c.0 == "itl_cdf.svg").unwrap().1;
        let t = texts(svg);
        assert!(t.iter().any(|x| x == "inter-token latency (ms), clipped at p99 = 11.00 ms"), "{t:?}");
        let x_max = tick_labels(svg).iter().map(|l| l.2.parse::<f64>().unwrap()).fold(0.0, f64::max);
        assert!(x_max < 20.0, "ticks run to {x_max}");
    }

    #[test]
    fn disaggregated_bars_are_named_by_pool() {
        let mut p = PlotData::new();
        p.add(&record(0.0, 0.0, &[10.0, 12.0]));
        let o = RenderOptions {
            worker_tokens: &[(100, 40), (100, 0)],
            subtitle: "",
            worker_pool: Some("prefill"),
            worker_counts: None,
        };
        let charts = p.render(&o).unwrap();
        let t = texts(&charts.iter().find(|c| c.0 == "worker_cache_hit_rate.svg").unwrap().1);
        for want in ["prefill 0", "prefill 1", "prefill worker", "Prefix-cache hit rate per prefill worker"] {
            assert!(t.iter().any(|x| x == want), "{want} missing: {t:?}");
        }
        // The y axis has its own "0"; a bare "1" could only be a worker.
        assert!(!t.iter().any(|x| x == "1"), "bare indices: {t:?}");
    }
}
