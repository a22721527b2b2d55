//! The text exposition format, version 0.0.4: what a `/metrics` answer
//! holds.
//!
//! An [`Exposition`] collects samples in any order and writes each
//! family once, in the order its first sample came: its `# HELP` line,
//! its `# TYPE` line, then its samples. So a caller may walk the GPUs
//! once and add every metric of each GPU, and still produce the grouping
//! the format requires.
//!
//! Glossary:
//! - *family*: every sample of one metric name, under one HELP and one
//!   TYPE line.
//! - *sample*: one line: the name, its labels (`{gpu="0",UUID="GPU-…"}`)
//!   and a value.
//! - *escaping*: in a label value `\`, `"` and a line feed are written
//!   `\\`, `\"` and `\n`; in HELP text `\` and a line feed only.

use std::collections::HashMap;
use std::fmt::Write as _;

/// The type of a metric, as its `# TYPE` line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A value that goes up and down.
    Gauge,
    /// A count that only grows (it starts again from zero when the
    /// process restarts).
    Counter,
}

impl MetricKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Gauge => "gauge",
            Self::Counter => "counter",
        }
    }
}

/// A metric: its name, type and help text. Declared as constants beside
/// the code that fills them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
    pub name: &'static str,
    /// Gauge or counter.
    pub kind: MetricKind,
    /// One line for people: what it is, in what unit.
    pub help: &'static str,
}

impl Metric {
    /// A gauge.
    pub const fn gauge(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: MetricKind::Gauge,
            help,
        }
    }

    /// A counter.
    pub const fn counter(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            kind: MetricKind::Counter,
            help,
        }
    }
}

/// One family's lines so far.
#[derive(Debug)]
struct Family {
    metric: Metric,
    samples: String,
}

/// A `/metrics` answer being written.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
    index: HashMap<&'static str, usize>,
}

impl Exposition {
    /// An empty answer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one sample of `metric` with `labels` (name, value) in the
    /// order given.
    pub fn sample(&mut self, metric: &Metric, labels: &[(&str, &str)], value: f64) {
        debug_assert!(is_metric_name(metric.name), "metric name {}", metric.name);
        let i = match self.index.get(metric.name) {
            Some(&i) => i,
            None => {
                self.families.push(Family {
                    metric: *metric,
                    samples: String::new(),
                });
                self.index.insert(metric.name, self.families.len() - 1);
                self.families.len() - 1
            }
        };
        let family = &mut self.families[i];
        debug_assert_eq!(
            family.metric, *metric,
            "one name, two declarations: {}",
            metric.name
        );
        write_sample(&mut family.samples, metric.name, labels, value);
    }

    /// Adds a sample that is 1 when `on`, else 0.
    pub fn flag(&mut self, metric: &Metric, labels: &[(&str, &str)], on: bool) {
        self.sample(metric, labels, if on { 1.0 } else { 0.0 });
    }

    /// The answer: every family with its HELP and TYPE lines once.
    pub fn finish(self) -> String {
        let mut out = String::new();
        for f in self.families {
            let _ = writeln!(
                out,
                "# HELP {} {}",
                f.metric.name,
                escape_help(f.metric.help)
            );
            let _ = writeln!(out, "# TYPE {} {}", f.metric.name, f.metric.kind.as_str());
            out.push_str(&f.samples);
        }
        out
    }
}

/// One sample line.
fn write_sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            debug_assert!(is_label_name(k), "label name {k}");
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            push_escaped(out, v);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    push_value(out, value);
    out.push('\n');
}

/// A value as the format writes it (`NaN`, `+Inf`, `-Inf`, or the number).
pub fn format_value(v: f64) -> String {
    let mut out = String::new();
    push_value(&mut out, v);
    out
}

/// Appends `v` as the format writes it.
fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("+Inf");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        let _ = write!(out, "{v}");
    }
}

/// A label value escaped: `\` → `\\`, `"` → `\"`, line feed → `\n`.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    push_escaped(&mut out, v);
    out
}

/// Appends `v` escaped as a label value.
fn push_escaped(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// HELP text escaped: `\` → `\\`, line feed → `\n`.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, and not starting with `__` (reserved).
fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    !s.starts_with("__")
        && matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMP: Metric = Metric::gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).");
    const DROPS: Metric = Metric::counter("loopwarden_drops_total", "Drops.\nTwo lines \\ here.");

    #[test]
    fn help_and_type_come_once_per_family_with_its_samples_grouped() {
        let mut e = Exposition::new();
        e.sample(&TEMP, &[("gpu", "0")], 41.0);
        e.sample(&DROPS, &[], 3.0);
        e.sample(&TEMP, &[("gpu", "1")], 43.5);
        let text = e.finish();
        assert_eq!(
            text,
            "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n\
             # TYPE DCGM_FI_DEV_GPU_TEMP gauge\n\
             DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} 41\n\
             DCGM_FI_DEV_GPU_TEMP{gpu=\"1\"} 43.5\n\
             # HELP loopwarden_drops_total Drops.\\nTwo lines \\\\ here.\n\
             # TYPE loopwarden_drops_total counter\n\
             loopwarden_drops_total 3\n"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut e = Exposition::new();
        e.sample(
            &TEMP,
            &[("modelName", "a \"quoted\" back\\slash\nand a line")],
            1.0,
        );
        let text = e.finish();
        assert!(
            text.contains(r#"{modelName="a \"quoted\" back\\slash\nand a line"} 1"#),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3, "one line per sample: {text}");
    }

    #[test]
    fn special_values_and_flags() {
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(-0.25), "-0.25");
        assert_eq!(format_value(1e6), "1000000");
        let mut e = Exposition::new();
        e.flag(&TEMP, &[], true);
        e.flag(&TEMP, &[("gpu", "1")], false);
        assert!(e
            .finish()
            .ends_with("DCGM_FI_DEV_GPU_TEMP 1\nDCGM_FI_DEV_GPU_TEMP{gpu=\"1\"} 0\n"));
    }

    #[test]
    fn names_follow_the_format() {
        assert!(is_metric_name("DCGM_FI_DEV_GPU_TEMP"));
        assert!(is_metric_name("a:b_c9"));
        assert!(!is_metric_name("9lives"));
        assert!(!is_metric_name("with-dash"));
        assert!(!is_metric_name(""));
        assert!(is_label_name("UUID") && is_label_name("modelName") && is_label_name("_x"));
        assert!(!is_label_name("__name__") && !is_label_name("a:b") && !is_label_name("1a"));
    }

    #[test]
    fn an_empty_answer_is_empty() {
        assert_eq!(Exposition::new().finish(), "");
    }
}
