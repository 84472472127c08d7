//! Metrics on the Prometheus project's `prometheus-client` crate: the pieces the server's and
//! the client's collectors share. Both encode what they show at scrape time from the state
//! they already keep (a [`Collector`]), so nothing is counted twice and a label set lives only
//! as long as the thing it names.
//!
//! [`Collector`]: prometheus_client::collector::Collector

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

pub use prometheus_client;

/// A sample's value. Whole numbers are written without a fraction (`1`, not `1.0`), floats
/// holding one included.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A count or a flag.
    Int(i64),
    /// A rate or an amount.
    Float(f64),
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Int(i64::from(v))
    }
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<usize> for Value {
    fn from(v: usize) -> Self {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(i64::from(v))
    }
}

/// Whether a family only goes up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Goes up and down.
    Gauge,
    /// Only goes up (reset by a restart). Its samples are written with `_total`.
    Counter,
}

impl Kind {
    fn metric_type(self) -> prometheus_client::metrics::MetricType {
        match self {
            Kind::Gauge => prometheus_client::metrics::MetricType::Gauge,
            Kind::Counter => prometheus_client::metrics::MetricType::Counter,
        }
    }
}

/// The family's name as the library wants it: a counter's without its `_total`, which the
/// OpenMetrics encoder appends to every sample.
fn family_name(name: &str, kind: Kind) -> &str {
    match kind {
        Kind::Counter => name.strip_suffix("_total").unwrap_or(name),
        Kind::Gauge => name,
    }
}

fn encode_value(
    encoder: prometheus_client::encoding::MetricEncoder<'_>,
    kind: Kind,
    v: Value,
) -> std::fmt::Result {
    // A whole number below 2^53 is written as one, whatever type it was counted in.
    let v = match v {
        Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::Int(f as i64),
        v => v,
    };
    match (kind, v) {
        (Kind::Gauge, Value::Int(v)) => ConstGauge::new(v).encode(encoder),
        (Kind::Gauge, Value::Float(v)) => ConstGauge::new(v).encode(encoder),
        (Kind::Counter, Value::Int(v)) => ConstCounter::new(u64::try_from(v).unwrap_or(0)).encode(encoder),
        (Kind::Counter, Value::Float(v)) => ConstCounter::new(if v > 0.0 { v } else { 0.0 }).encode(encoder),
    }
}

/// One family with no labels and one sample. `name` is the sample's name (a counter's
/// ending in `_total`).
pub fn single(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: Kind,
    v: impl Into<Value>,
) -> std::fmt::Result {
    let e = encoder.encode_descriptor(family_name(name, kind), help, None, kind.metric_type())?;
    encode_value(e, kind, v.into())
}

/// One family with one label: a sample per `(label value, value)`.
pub fn family<'a, V: Into<Value>>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: Kind,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, V)>,
) -> std::fmt::Result {
    let mut e = encoder.encode_descriptor(family_name(name, kind), help, None, kind.metric_type())?;
    for (value, v) in samples {
        let labels = [(label, value)];
        encode_value(e.encode_family(&labels)?, kind, v.into())?;
    }
    Ok(())
}

/// The text a registry encodes to, ending with OpenMetrics's `# EOF`.
pub fn text(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::with_capacity(4096);
    // Writing into a String cannot fail; a collector that fails leaves what it wrote.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// The content type of [`text`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of the classic text format [`Classic`] writes.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a scraper's `Accept` header asks for OpenMetrics (Prometheus's own scrapes do);
/// anything else (`curl`, `promtool check metrics`, older scrapers) gets the classic text
/// format.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// Writes OpenMetrics text, as the encoder makes it, in Prometheus's classic text format
/// (0.0.4) instead: a counter's `HELP` and `TYPE` name the family with its `_total`, as its
/// samples do, and there is no `# EOF`. The text comes in pieces of any size; call
/// [`finish`](Self::finish) after the last.
#[derive(Debug)]
pub struct Classic<W> {
    out: W,
    line: String,
    help: Option<String>,
}

impl<W: std::fmt::Write> Classic<W> {
    /// Writing to `out`.
    pub fn new(out: W) -> Self {
        Classic { out, line: String::new(), help: None }
    }

    /// Writes what is left (a last line without its newline) and gives `out` back.
    pub fn finish(mut self) -> Result<W, std::fmt::Error> {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line)?;
        }
        if let Some(help) = self.help.take() {
            self.out.write_str(&help)?;
        }
        Ok(self.out)
    }

    fn line_done(&mut self, line: &str) -> std::fmt::Result {
        if line.starts_with("# HELP ") {
            // Held until the TYPE line says whether the family is a counter.
            if let Some(help) = self.help.replace(line.to_owned()) {
                self.out.write_str(&help)?;
            }
            return Ok(());
        }
        if line.starts_with("# EOF") || line.starts_with("# UNIT ") {
            return Ok(());
        }
        let counter = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.trim_end().strip_suffix(" counter"))
            .filter(|name| !name.ends_with("_total"));
        match (counter, self.help.take()) {
            (Some(name), help) => {
                if let Some(help) = help {
                    let text = help.strip_prefix(&format!("# HELP {name} ")).unwrap_or("\n");
                    write!(self.out, "# HELP {name}_total {text}")?;
                }
                writeln!(self.out, "# TYPE {name}_total counter")
            }
            (None, help) => {
                if let Some(help) = help {
                    self.out.write_str(&help)?;
                }
                self.out.write_str(line)
            }
        }
    }
}

impl<W: std::fmt::Write> std::fmt::Write for Classic<W> {
    fn write_str(&mut self, mut s: &str) -> std::fmt::Result {
        while let Some(end) = s.find('\n') {
            let (head, rest) = s.split_at(end + 1);
            let line = if self.line.is_empty() {
                head.to_owned()
            } else {
                let mut l = std::mem::take(&mut self.line);
                l.push_str(head);
                l
            };
            self.line_done(&line)?;
            s = rest;
        }
        self.line.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;
    use std::fmt::Write as _;

    #[derive(Debug)]
    struct Two;

    impl Collector for Two {
        fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
            family(&mut e, "m_units", "A gauge.", Kind::Gauge, "group", [("a\"b\\c\nd", 1.5)])?;
            family(&mut e, "n_total", "A counter.", Kind::Counter, "group", [("x", 3u64)])?;
            single(&mut e, "flag", "A flag.", Kind::Gauge, true)
        }
    }

    #[test]
    fn labels_are_escaped_counters_end_in_total_and_whole_numbers_have_no_fraction() {
        let mut r = Registry::default();
        r.register_collector(Box::new(Two));
        let out = text(&r);
        assert!(out.contains("m_units{group=\"a\\\"b\\\\c\\nd\"} 1.5\n"), "{out}");
        assert!(out.contains("# TYPE n counter\nn_total{group=\"x\"} 3\n"), "{out}");
        assert!(out.contains("\nflag 1\n"), "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
    }

    #[test]
    fn the_classic_format_names_counters_with_their_total_and_has_no_eof() {
        let mut r = Registry::default();
        r.register_collector(Box::new(Two));
        let open = text(&r);
        // Fed in pieces of every size, the output is the same.
        for piece in [1, 7, 4096] {
            let mut classic = Classic::new(String::new());
            let chars: Vec<char> = open.chars().collect();
            for chunk in chars.chunks(piece) {
                classic.write_str(&chunk.iter().collect::<String>()).unwrap();
            }
            let out = classic.finish().unwrap();
            assert!(
                out.contains("# HELP n_total A counter.\n# TYPE n_total counter\nn_total{group=\"x\"} 3\n"),
                "{out}"
            );
            assert!(out.contains("# HELP m_units A gauge.\n# TYPE m_units gauge\n"), "{out}");
            assert!(!out.contains("# EOF") && out.ends_with("flag 1\n"), "{out}");
        }
        assert!(wants_openmetrics(Some("application/openmetrics-text;version=1.0.0,text/plain;q=0.5")));
        assert!(!wants_openmetrics(Some("*/*")) && !wants_openmetrics(None));
    }
}
