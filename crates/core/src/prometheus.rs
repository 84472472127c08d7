//! Prometheus's text exposition format: the pieces the server's and the client's `/metrics`
//! share.

use std::fmt::Write as _;

/// Writes `s` as a label value: backslash, double quote and newline escaped.
pub fn write_label(out: &mut String, s: &str) {
    if !s.contains(['\\', '"', '\n']) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// A metric family's `# HELP` and `# TYPE` lines.
pub fn write_header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One sample with one label: `name{label="value"} v`.
pub fn write_sample(out: &mut String, name: &str, label: &str, value: &str, v: f64) {
    out.push_str(name);
    out.push('{');
    out.push_str(label);
    out.push_str("=\"");
    write_label(out, value);
    let _ = writeln!(out, "\"}} {v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        let mut out = String::new();
        write_sample(&mut out, "m", "group", "a\"b\\c\nd", 1.5);
        assert_eq!(out, "m{group=\"a\\\"b\\\\c\\nd\"} 1.5\n");
    }
}
