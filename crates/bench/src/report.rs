//! The report: figures with their median, min and max over the runs, the
//! targets they are held against, and how they print.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Workload;

/// One measured quantity over every run that produced it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// The workload (`send-each`, ...) or probe (`disk-fsync`, `store-commit`).
    pub workload: String,
    /// What is measured, e.g. `rate`, `p50`, `rss_over_idle`.
    pub metric: String,
    /// Its unit, e.g. `msgs/s`, `ms`, `MiB`.
    pub unit: String,
    /// Messages (or probe iterations) per run.
    pub count: u64,
    /// One value per run that produced one, in run order.
    pub values: Vec<f64>,
    /// The median of `values` (the mean of the middle two for an even count).
    pub median: Option<f64>,
    /// The smallest value.
    pub min: Option<f64>,
    /// The largest value.
    pub max: Option<f64>,
    /// The target, if the figure has one: `>= x` or `<= x` in `unit`.
    pub target: Option<Target>,
    /// How the target was set, for a person.
    pub target_note: Option<String>,
}

/// A figure's target.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// At least this.
    AtLeast(f64),
    /// At most this.
    AtMost(f64),
}

impl Target {
    /// Whether `v` meets the target.
    pub fn met_by(self, v: f64) -> bool {
        match self {
            Target::AtLeast(t) => v >= t,
            Target::AtMost(t) => v <= t,
        }
    }
}

/// The machine a report was measured on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// CPUs this process may use.
    pub nproc: usize,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu: String,
    /// The kernel release.
    pub kernel: String,
    /// The load average (1 minute) when the bench started.
    pub load: Option<f64>,
    /// The load average (1 minute) when it ended.
    pub load_end: Option<f64>,
    /// CPU pressure over the bench's last minute: the share of time some
    /// task waited for a CPU, in percent (`/proc/pressure/cpu`, avg60).
    pub cpu_pressure: Option<f64>,
    /// IO pressure over the last minute, likewise (`/proc/pressure/io`).
    pub io_pressure: Option<f64>,
}

impl Machine {
    pub(super) fn read() -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            kernel,
            load: load_average(),
            load_end: None,
            cpu_pressure: None,
            io_pressure: None,
        }
    }

    /// Notes how busy the machine was by the end of the bench.
    pub(super) fn finish(&mut self) {
        self.load_end = load_average();
        self.cpu_pressure = super::measure::pressure("cpu");
        self.io_pressure = super::measure::pressure("io");
    }
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|v| v.parse().ok()))
}

/// What `mesh bench` measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `local` or `peer`.
    pub mode: String,
    /// Daemons (local) or 2 (this node and the peer).
    pub nodes: usize,
    /// Payload bytes per message.
    pub size: usize,
    /// Runs asked for.
    pub runs: u32,
    /// Messages in flight when pipelining.
    pub window: usize,
    /// Messages per second in the latency workload.
    pub rate: u32,
    /// The workloads asked for, with their counts.
    pub plan: Vec<(String, u64)>,
    /// Where it ran.
    pub machine: Machine,
    /// The `mesh` version.
    pub version: String,
    /// The directory the data was in (it decides the disk).
    pub data_dir: String,
    /// The figures, in print order.
    pub figures: Vec<Figure>,
    /// What went wrong, one line per failed workload run.
    pub errors: Vec<String>,
    /// Remarks for a person (what a mode cannot measure, capped counts).
    pub notes: Vec<String>,
    /// Wall time of the whole bench, seconds.
    pub seconds: f64,
}

/// Collects values per (workload, metric) as runs produce them.
#[derive(Debug, Default)]
pub(super) struct Collector {
    order: Vec<(String, String)>,
    figures: BTreeMap<(String, String), Figure>,
    pub(super) errors: Vec<String>,
    pub(super) notes: Vec<String>,
}

impl Collector {
    /// Adds one run's value.
    pub(super) fn add(&mut self, workload: &str, metric: &str, unit: &str, count: u64, v: f64) {
        let key = (workload.to_owned(), metric.to_owned());
        let f = self.figures.entry(key.clone()).or_insert_with(|| {
            self.order.push(key);
            Figure {
                workload: workload.to_owned(),
                metric: metric.to_owned(),
                unit: unit.to_owned(),
                count,
                values: Vec::new(),
                median: None,
                min: None,
                max: None,
                target: None,
                target_note: None,
            }
        });
        f.count = count;
        if v.is_finite() {
            f.values.push(v);
        }
    }

    /// Sorts `lat` and adds its p50, p99 and max (ms) as the latency
    /// figures `{prefix}p50`, `{prefix}p99` and `{prefix}max`; returns
    /// them (NaN where `lat` is empty) for the progress line.
    pub(super) fn add_latency(
        &mut self,
        prefix: &str,
        count: u64,
        lat: &mut [Duration],
    ) -> (f64, f64, f64) {
        lat.sort();
        let q = |x| super::measure::quantile(lat, x).map_or(f64::NAN, super::measure::ms);
        let (p50, p99, max) = (q(0.5), q(0.99), q(1.0));
        self.add("latency", &format!("{prefix}p50"), "ms", count, p50);
        self.add("latency", &format!("{prefix}p99"), "ms", count, p99);
        self.add("latency", &format!("{prefix}max"), "ms", count, max);
        (p50, p99, max)
    }

    /// Declares a figure that may get no value (so a failure shows as a gap).
    pub(super) fn declare(&mut self, workload: &str, metric: &str, unit: &str, count: u64) {
        let key = (workload.to_owned(), metric.to_owned());
        if !self.figures.contains_key(&key) {
            self.add(workload, metric, unit, count, f64::NAN);
        }
    }

    pub(super) fn error(&mut self, run: u32, w: &str, e: &anyhow::Error) {
        self.errors.push(format!("run {run}: {w}: {e:#}"));
    }

    fn median_of(&self, workload: &str, metric: &str) -> Option<f64> {
        let f = self
            .figures
            .get(&(workload.to_owned(), metric.to_owned()))?;
        stats(&f.values).map(|s| s.0)
    }

    /// The figures with their statistics and targets.
    pub(super) fn finish(mut self) -> (Vec<Figure>, Vec<String>, Vec<String>) {
        let fsync = self.median_of("disk-fsync", "rate");
        for f in self.figures.values_mut() {
            if let Some((med, min, max)) = stats(&f.values) {
                f.median = Some(med);
                f.min = Some(min);
                f.max = Some(max);
            }
            let (target, note) = target_of(&f.workload, &f.metric, fsync);
            f.target = target;
            f.target_note = note;
        }
        let mut figures = Vec::new();
        for key in self.order {
            if let Some(f) = self.figures.remove(&key) {
                figures.push(f);
            }
        }
        (figures, self.errors, self.notes)
    }
}

/// The targets of the issue that set them: send-each at 80 % of the disk's
/// serial fsync rate, 60k/s pipelined, 110k/s catch-up, latency p50 within
/// two fsyncs + 200 µs and p99 within 5 ms, 64 MiB queued memory.
fn target_of(
    workload: &str,
    metric: &str,
    fsync_rate: Option<f64>,
) -> (Option<Target>, Option<String>) {
    let fixed = |t: Target, note: &str| (Some(t), Some(note.to_owned()));
    match (workload, metric) {
        ("send-each", "rate") => match fsync_rate {
            Some(r) => fixed(Target::AtLeast(0.8 * r), "80 % of the disk's fsync rate"),
            None => (None, None),
        },
        ("send-pipelined", "rate") => fixed(Target::AtLeast(60_000.0), "60k msgs/s"),
        ("catch-up", "rate") => fixed(Target::AtLeast(110_000.0), "110k msgs/s, all verified"),
        ("latency", "p50") => match fsync_rate {
            Some(r) if r > 0.0 => fixed(Target::AtMost(2_000.0 / r + 0.2), "two fsyncs + 0.2 ms"),
            _ => (None, None),
        },
        ("latency", "p99") => fixed(Target::AtMost(5.0), "5 ms"),
        ("queued-memory", "rss_over_idle") => fixed(Target::AtMost(64.0), "64 MiB"),
        _ => (None, None),
    }
}

/// (median, min, max) of `values`; `None` if empty.
pub(super) fn stats(values: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Some((median, v[0], v[n - 1]))
}

/// A number for a table: no decimals from 100 up, then 2–3 significant digits.
fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

impl Report {
    /// The workloads that were asked for but produced no figure in any run.
    pub fn missing(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (w, _) in &self.plan {
            let has = self
                .figures
                .iter()
                .any(|f| &f.workload == w && f.median.is_some());
            if !has {
                out.push(w.clone());
            }
        }
        out
    }

    /// The report as a table for people.
    pub fn table(&self) -> String {
        let mut out = String::new();
        self.write_header(&mut out);
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<15} {:<14} {:>9} {:>10} {:>10} {:>10}  {:<10} target",
            "workload", "figure", "count", "median", "min", "max", "unit"
        );
        for f in &self.figures {
            let cell = |v: Option<f64>| v.map(num).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                out,
                "{:<15} {:<14} {:>9} {:>10} {:>10} {:>10}  {:<10} {}",
                f.workload,
                f.metric,
                f.count,
                cell(f.median),
                cell(f.min),
                cell(f.max),
                f.unit,
                target_text(f).trim_end()
            );
        }
        self.write_footer(&mut out);
        out
    }

    /// The table's first lines: the mode, the machine and its load.
    fn write_header(&self, out: &mut String) {
        let m = &self.machine;
        let _ = writeln!(
            out,
            "mesh bench {}: {} nodes, {}-byte payloads, {} run{} ({:.0} s)",
            self.mode,
            self.nodes,
            self.size,
            self.runs,
            if self.runs == 1 { "" } else { "s" },
            self.seconds
        );
        let _ = writeln!(
            out,
            "machine: {} × {}, Linux {}; data in {}",
            m.nproc, m.cpu, m.kernel, self.data_dir
        );
        let opt = |v: Option<f64>| v.map_or_else(|| "?".to_owned(), |v| format!("{v:.1}"));
        let _ = writeln!(
            out,
            "load average {} at start, {} at end; in the last minute some task waited for a CPU {} % \
             and for IO {} % of the time",
            opt(m.load),
            opt(m.load_end),
            opt(m.cpu_pressure),
            opt(m.io_pressure)
        );
    }

    /// The table's last lines: send-each against the fsync rate, the notes
    /// and the errors.
    fn write_footer(&self, out: &mut String) {
        if let (Some(each), Some(fsync)) = (
            self.figure("send-each", "rate").and_then(|f| f.median),
            self.figure("disk-fsync", "rate").and_then(|f| f.median),
        ) && fsync > 0.0
        {
            let _ = writeln!(
                out,
                "\nsend-each is {:.0} % of the disk's serial fsync rate measured in the same runs.",
                100.0 * each / fsync
            );
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        for e in &self.errors {
            let _ = writeln!(out, "error: {e}");
        }
    }

    /// The figure for `workload` and `metric`, if measured.
    pub fn figure(&self, workload: &str, metric: &str) -> Option<&Figure> {
        self.figures
            .iter()
            .find(|f| f.workload == workload && f.metric == metric)
    }

    pub(super) fn plan_of(plan: &[(Workload, u64)]) -> Vec<(String, u64)> {
        plan.iter()
            .map(|(w, c)| (w.name().to_owned(), *c))
            .collect()
    }
}

/// A figure's target cell: the bound, its note, and whether the median met
/// it (empty without a target).
fn target_text(f: &Figure) -> String {
    match (f.target, &f.target_note, f.median) {
        (Some(t), note, med) => {
            let (op, x) = match t {
                Target::AtLeast(x) => ("≥", x),
                Target::AtMost(x) => ("≤", x),
            };
            let verdict = match med {
                Some(v) if t.met_by(v) => "met",
                Some(_) => "MISSED",
                None => "",
            };
            let note = note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            format!("{op} {}{note} {verdict}", num(x))
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(stats(&[3.0, 1.0, 2.0]), Some((2.0, 1.0, 3.0)));
        assert_eq!(stats(&[4.0, 1.0, 2.0, 3.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(stats(&[f64::NAN]), None);
    }

    #[test]
    fn a_figure_without_values_is_missing_and_prints_a_dash() {
        let mut c = Collector::default();
        c.add("disk-fsync", "rate", "fsyncs/s", 10, 1000.0);
        c.declare("send-each", "rate", "msgs/s", 5);
        let (figures, errors, notes) = c.finish();
        let report = Report {
            mode: "local".into(),
            nodes: 2,
            size: 1024,
            runs: 1,
            window: 256,
            rate: 1000,
            plan: vec![("send-each".into(), 5)],
            machine: Machine::read(),
            version: "test".into(),
            data_dir: "/tmp".into(),
            figures,
            errors,
            notes,
            seconds: 1.0,
        };
        assert_eq!(report.missing(), vec!["send-each".to_owned()]);
        let table = report.table();
        assert!(
            table.contains("≥ 800 (80 % of the disk's fsync rate)"),
            "{table}"
        );
    }
}
