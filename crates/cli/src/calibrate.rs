//! `tollgate calibrate`: fits the `linear` cost model's coefficients to measurements.
//!
//! TiDB's resource control prices a request as a linear sum — a cost per request, per byte
//! of I/O and per CPU second — and notes that the coefficients differ from one environment to
//! the next, so they are found by regression on measured data. This does that: each CSV row is
//! one request or one interval, with what it did (requests, bytes, CPU) and the resource use
//! observed for it (busy time, say); ordinary least squares, solved by Householder QR on
//! columns scaled to unit length, gives the coefficients, and their standard errors come from
//! the same factorisation. A cost cannot be negative: a coefficient fitted below zero has its
//! column left out and the rest fitted again, and the output says so.

use std::fmt::Write as _;

use anyhow::{Context as _, bail};

/// The largest file read, in bytes.
pub const CSV_MAX_BYTES: usize = 64 << 20;
/// The most rows fitted.
pub const ROWS_MAX: usize = 1_000_000;

/// A column the model knows: its CSV name, the settings key it becomes, and what it counts.
struct Term {
    column: &'static str,
    key: &'static str,
    per: &'static str,
}

const TERMS: [Term; 6] = [
    Term { column: "requests", key: "read_base and write_base", per: "request" },
    Term { column: "reads", key: "read_base", per: "read request" },
    Term { column: "writes", key: "write_base", per: "write request" },
    Term { column: "read_bytes", key: "read_per_byte", per: "byte read" },
    Term { column: "write_bytes", key: "write_per_byte", per: "byte written" },
    Term { column: "cpu_ms", key: "per_cpu_ms", per: "CPU millisecond" },
];

/// Measurements: the model's columns present, and the observed value, row by row.
#[derive(Debug)]
pub struct Data {
    /// Indices into `TERMS`, in the file's order.
    terms: Vec<usize>,
    /// Row-major, `terms.len()` values per row.
    x: Vec<f64>,
    y: Vec<f64>,
    /// The file line of each row.
    lines: Vec<usize>,
    observed: String,
}

/// The header's columns: each term's column and its index in `TERMS`, and the observed
/// column; or why the header cannot be fitted, naming the column.
fn columns(
    names: &[&str],
    observed: &str,
    header_line: usize,
) -> anyhow::Result<(Vec<(usize, usize)>, usize)> {
    let mut terms = Vec::new();
    let mut y_at = None;
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            bail!("line {header_line}: column {name:?} appears twice");
        }
        if *name == observed {
            y_at = Some(i);
        } else if let Some(t) = TERMS.iter().position(|t| t.column == *name) {
            terms.push((i, t));
        } else {
            let known: Vec<&str> = TERMS.iter().map(|t| t.column).collect();
            bail!(
                "line {header_line}: column {name:?} is not one the model knows ({}) nor the observed column {observed:?} (--observed)",
                known.join(", ")
            );
        }
    }
    let Some(y_at) = y_at else {
        bail!(
            "line {header_line}: no column {observed:?} holds the observed resource use (name it with --observed)"
        )
    };
    if terms.is_empty() {
        bail!(
            "line {header_line}: no column to fit: give at least one of requests, reads, writes, read_bytes, write_bytes, cpu_ms"
        );
    }
    let has = |c: &str| terms.iter().any(|&(_, t)| TERMS[t].column == c);
    if has("requests") && (has("reads") || has("writes")) {
        bail!("line {header_line}: give requests, or reads and writes, not both");
    }
    Ok((terms, y_at))
}

/// `tollgate calibrate`: fits the model to `file` (`-`: standard input) and says the fit.
pub fn run(file: &std::path::Path, observed: &str) -> anyhow::Result<()> {
    let text = crate::read_text(file, CSV_MAX_BYTES)?;
    let data = parse(&text, observed).with_context(|| format!("{}", file.display()))?;
    let fit = fit(&data).with_context(|| format!("{}: cannot fit", file.display()))?;
    for line in report(&data, &fit).lines() {
        crate::say(line);
    }
    Ok(())
}

/// Reads CSV text: a header naming the columns, then one row of numbers per record, as a
/// spreadsheet exports it (quoted fields, CRLF line ends, a UTF-8 byte-order mark). `#`
/// starts a comment line; blank lines are skipped. Columns the model does not know are
/// refused, so a misspelt name is not silently left out.
pub fn parse(text: &str, observed: &str) -> anyhow::Result<Data> {
    if text.len() > CSV_MAX_BYTES {
        bail!("the file is {} bytes; at most {CSV_MAX_BYTES} are read", text.len());
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .comment(Some(b'#'))
        .trim(csv::Trim::All)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut rows = reader.records().filter(|r| r.as_ref().map_or(true, |r| r.iter().any(|c| !c.is_empty())));
    // The file line a record starts on, from its byte offset. After a CRLF the offset is the
    // LF's (the reader takes the pair as one end), so the byte at the offset counts too: a
    // record never begins with a line end of its own.
    let line_at = |p: &csv::Position| {
        let at = usize::try_from(p.byte()).unwrap_or(usize::MAX).saturating_add(1).min(text.len());
        text.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1
    };
    let line_of = |r: &csv::StringRecord| r.position().map_or(0, line_at);
    let record = |r: Result<csv::StringRecord, csv::Error>| -> anyhow::Result<csv::StringRecord> {
        r.map_err(|e| match e.position() {
            Some(p) => anyhow::anyhow!("line {}: {e}", line_at(p)),
            None => anyhow::anyhow!("{e}"),
        })
    };
    let Some(header) = rows.next() else { bail!("the file has no header line") };
    let header = record(header)?;
    let header_line = line_of(&header);
    let names: Vec<&str> = header.iter().collect();
    let (terms, y_at) = columns(&names, observed, header_line)?;
    let mut data = Data {
        terms: terms.iter().map(|&(_, t)| t).collect(),
        x: Vec::new(),
        y: Vec::new(),
        lines: Vec::new(),
        observed: observed.to_string(),
    };
    for row in rows {
        let row = record(row)?;
        let line = line_of(&row);
        if data.y.len() == ROWS_MAX {
            bail!("line {line}: more than {ROWS_MAX} rows");
        }
        let cells: Vec<&str> = row.iter().collect();
        if cells.len() != names.len() {
            bail!("line {line}: {} values for {} columns", cells.len(), names.len());
        }
        let number = |i: usize| -> anyhow::Result<f64> {
            match cells[i].parse::<f64>() {
                Ok(v) if (0.0..=1e15).contains(&v) => Ok(v),
                _ => bail!(
                    "line {line}, column {}: expected a number from 0 to 1e15, got {:?}",
                    names[i],
                    cells[i]
                ),
            }
        };
        for &(i, _) in &terms {
            data.x.push(number(i)?);
        }
        data.y.push(number(y_at)?);
        data.lines.push(line);
    }
    Ok(data)
}

/// A fitted model.
#[derive(Debug)]
pub struct Fit {
    /// `(term index, coefficient, standard error)`, for the terms kept.
    pub coefficients: Vec<(usize, f64, f64)>,
    /// Terms left out because their coefficient came out negative.
    pub dropped: Vec<usize>,
    /// 1 − residual sum of squares / total sum of squares about the mean.
    pub r2: f64,
    /// Root mean square of the residuals.
    pub rms: f64,
    /// The largest residual in size, and the file line of its row.
    pub worst: (f64, usize),
    /// The mean observed value.
    pub mean: f64,
    /// Rows fitted.
    pub rows: usize,
}

/// Householder's reflection of column `k` of the `n` × `p` matrix `a` (whose norm below the
/// diagonal is `norm`), applied to `a`'s columns from `k` on and to `b`.
fn reflect(a: &mut [f64], b: &mut [f64], (n, p): (usize, usize), k: usize, norm: f64) {
    let alpha = if a[k * p + k] > 0.0 { -norm } else { norm };
    let mut v: Vec<f64> = (k..n).map(|i| a[i * p + k]).collect();
    v[0] -= alpha;
    let vv: f64 = v.iter().map(|x| x * x).sum();
    if vv <= 0.0 {
        return;
    }
    for j in k..p {
        let dot: f64 = (k..n).map(|i| v[i - k] * a[i * p + j]).sum();
        let f = 2.0 * dot / vv;
        for i in k..n {
            a[i * p + j] -= f * v[i - k];
        }
    }
    let dot: f64 = (k..n).map(|i| v[i - k] * b[i]).sum();
    let f = 2.0 * dot / vv;
    for i in k..n {
        b[i] -= f * v[i - k];
    }
}

/// The inverse of the upper triangle R in the first `p` rows of `a` (`p` columns a row).
fn r_inverse(a: &[f64], p: usize) -> Vec<f64> {
    let mut rinv = vec![0.0; p * p];
    for c in 0..p {
        for k in (0..=c).rev() {
            let e = if k == c { 1.0 } else { 0.0 };
            let s: f64 = (k + 1..=c).map(|j| a[k * p + j] * rinv[j * p + c]).sum();
            rinv[k * p + c] = (e - s) / a[k * p + k];
        }
    }
    rinv
}

/// Least squares on the columns `cols` of `data`: coefficients and standard errors, or why
/// the data cannot give them.
fn least_squares(data: &Data, cols: &[usize]) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let n = data.y.len();
    let p = cols.len();
    let width = data.terms.len();
    let name = |j: usize| TERMS[data.terms[cols[j]]].column;
    if n < p + 3 {
        bail!("{n} rows for {p} coefficients: at least {} are needed (the coefficients plus three)", p + 3);
    }
    // Columns scaled to unit length, so that QR's tolerance means the same for each.
    let mut a = vec![0.0; n * p];
    let mut scale = vec![0.0; p];
    for j in 0..p {
        let norm = (0..n).map(|i| data.x[i * width + cols[j]].powi(2)).sum::<f64>().sqrt();
        if norm == 0.0 {
            bail!("{}: every row is 0, so its cost cannot be fitted; leave the column out", name(j));
        }
        scale[j] = norm;
        for i in 0..n {
            a[i * p + j] = data.x[i * width + cols[j]] / norm;
        }
    }
    let mut b = data.y.clone();
    // Householder QR, applying each reflection to `b` as it goes.
    let mut diag = vec![0.0; p];
    for k in 0..p {
        let norm = (k..n).map(|i| a[i * p + k].powi(2)).sum::<f64>().sqrt();
        if norm < 1e-9 {
            let others: Vec<&str> = (0..k).map(name).collect();
            bail!(
                "{} is (almost) a combination of {}: the data cannot tell their costs apart; vary them independently, or leave one out",
                name(k),
                others.join(" and ")
            );
        }
        reflect(&mut a, &mut b, (n, p), k, norm);
        diag[k] = a[k * p + k];
    }
    let (largest, smallest) =
        diag.iter().fold((0.0f64, f64::INFINITY), |(l, s), d| (l.max(d.abs()), s.min(d.abs())));
    if largest / smallest > 1e7 {
        let k = diag.iter().position(|d| d.abs() == smallest).unwrap_or(0);
        bail!(
            "{} is too close to a combination of the other columns (condition {:.1e}): the fit would be noise; vary the columns independently, or leave one out",
            name(k),
            largest / smallest
        );
    }
    // Back substitution for the coefficients, and R⁻¹ for their variances.
    let mut coef = vec![0.0; p];
    for k in (0..p).rev() {
        let s: f64 = (k + 1..p).map(|j| a[k * p + j] * coef[j]).sum();
        coef[k] = (b[k] - s) / a[k * p + k];
    }
    let rinv = r_inverse(&a, p);
    let ssr: f64 = b[p..].iter().map(|r| r * r).sum();
    let sigma2 = ssr / (n - p) as f64;
    let mut se = vec![0.0; p];
    for k in 0..p {
        let var: f64 = (k..p).map(|c| rinv[k * p + c].powi(2)).sum::<f64>() * sigma2;
        se[k] = var.sqrt() / scale[k];
        coef[k] /= scale[k];
    }
    Ok((coef, se))
}

/// Fits the data; a negative coefficient's column is left out and the rest fitted again.
pub fn fit(data: &Data) -> anyhow::Result<Fit> {
    let mut cols: Vec<usize> = (0..data.terms.len()).collect();
    let mut dropped = Vec::new();
    let (coef, se) = loop {
        let (coef, se) = least_squares(data, &cols)?;
        let worst = (0..cols.len()).filter(|&j| coef[j] < 0.0).min_by(|&a, &b| coef[a].total_cmp(&coef[b]));
        match worst {
            Some(j) if cols.len() > 1 => dropped.push(data.terms[cols.remove(j)]),
            Some(j) => bail!(
                "{}: its cost comes out negative ({:.4e}) however it is fitted: the observed column does not grow with it",
                TERMS[data.terms[cols[j]]].column,
                coef[j]
            ),
            None => break (coef, se),
        }
    };
    let width = data.terms.len();
    let n = data.y.len();
    let mean = data.y.iter().sum::<f64>() / n as f64;
    let (mut ssr, mut sst, mut worst) = (0.0, 0.0, (0.0f64, 0));
    for i in 0..n {
        let predicted: f64 = cols.iter().zip(&coef).map(|(&c, k)| data.x[i * width + c] * k).sum();
        let r = data.y[i] - predicted;
        ssr += r * r;
        sst += (data.y[i] - mean).powi(2);
        if r.abs() > worst.0.abs() {
            worst = (r, data.lines[i]);
        }
    }
    Ok(Fit {
        coefficients: cols.iter().enumerate().map(|(j, &c)| (data.terms[c], coef[j], se[j])).collect(),
        dropped,
        r2: if sst > 0.0 { 1.0 - ssr / sst } else { 1.0 },
        rms: (ssr / n as f64).sqrt(),
        worst,
        mean,
        rows: n,
    })
}

/// A number to `digits` significant digits, in the shortest form that reads back as it.
fn sig(k: f64, digits: usize) -> String {
    let rounded: f64 = format!("{k:.*e}", digits.saturating_sub(1)).parse().unwrap_or(k);
    format!("{rounded}")
}

fn six(k: f64) -> String {
    sig(k, 6)
}

/// What `tollgate calibrate` prints: the coefficients, the fit, and the settings to use.
pub fn report(data: &Data, fit: &Fit) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fitted {} coefficient{} on {} rows; units are those of {:?}",
        fit.coefficients.len(),
        if fit.coefficients.len() == 1 { "" } else { "s" },
        fit.rows,
        data.observed
    );
    for &(t, k, se) in &fit.coefficients {
        let _ = writeln!(
            out,
            "  {:<12} {:>14} ± {:<10} per {}",
            TERMS[t].column,
            six(k),
            sig(se, 3),
            TERMS[t].per
        );
    }
    for &t in &fit.dropped {
        let _ = writeln!(
            out,
            "  {:<12} left out: its cost came out negative, so it does not explain the observed use",
            TERMS[t].column
        );
    }
    let _ = writeln!(
        out,
        "R² {:.4}; residual RMS {} ({:.1} % of the mean observed, {}); largest residual {} at line {}",
        fit.r2,
        sig(fit.rms, 4),
        if fit.mean > 0.0 { 100.0 * fit.rms / fit.mean } else { 0.0 },
        sig(fit.mean, 4),
        sig(fit.worst.0, 4),
        fit.worst.1
    );
    if fit.r2 < 0.9 {
        let _ = writeln!(out, "warning: R² below 0.9: the columns explain little of the observed use");
    }
    let _ = writeln!(out, "\n# settings file (tollgate check-config takes it)\n[cost]\nmodel = \"linear\"");
    for &(t, k, _) in &fit.coefficients {
        for key in TERMS[t].key.split(" and ") {
            let _ = writeln!(out, "{key} = {}", six(k));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows from known coefficients plus noise of ±`noise` (relative), on a fixed generator.
    fn made(rows: usize, noise: f64) -> String {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut csv = String::from("reads,writes,read_bytes,write_bytes,cpu_ms,busy_us\n");
        for _ in 0..rows {
            let (r, w) = ((next() * 100.0).floor(), (next() * 50.0).floor());
            let (rb, wb, cpu) = (r * 4096.0 * next() * 2.0, w * 1024.0 * next() * 2.0, next() * 80.0);
            let busy = (3.0 * r + 12.0 * w + 0.002 * rb + 0.01 * wb + 40.0 * cpu)
                * (1.0 + noise * (next() * 2.0 - 1.0));
            let _ = writeln!(csv, "{r},{w},{rb},{wb},{cpu},{busy}");
        }
        csv
    }

    /// Regression: a spreadsheet's export (a byte-order mark, a quoted header, CRLF) was refused.
    #[test]
    fn a_spreadsheet_export_reads_as_plain_csv_does() {
        let plain = "requests,read_bytes,busy_us\n10,1000,55\n20,4000,130\n30,2000,120\n";
        let export = "\u{feff}\"requests\",\"read_bytes\",\"busy_us\"\r\n10,1000,55\r\n\"20\",4000,130\r\n30,2000,120\r\n";
        let (a, b) = (parse(plain, "busy_us").unwrap(), parse(export, "busy_us").unwrap());
        assert_eq!((a.x, a.y, a.lines), (b.x.clone(), b.y.clone(), b.lines.clone()));
        assert_eq!(b.lines, vec![2, 3, 4]);
        // Comments and blank lines are skipped, and a bad cell is named by its line.
        let err = parse("# made by hand\nrequests,busy_us\n\n1,2\n2,x\n", "busy_us").unwrap_err();
        assert_eq!(err.to_string(), "line 5, column busy_us: expected a number from 0 to 1e15, got \"x\"");
    }

    #[test]
    fn known_coefficients_are_recovered_from_noisy_data() {
        let data = parse(&made(2000, 0.05), "busy_us").unwrap();
        let f = fit(&data).unwrap();
        let want = [3.0, 12.0, 0.002, 0.01, 40.0];
        for (&(t, k, se), w) in f.coefficients.iter().zip(want) {
            assert!((k - w).abs() / w < 0.03, "{}: {k} for {w}", TERMS[t].column);
            assert!(se > 0.0 && se < 0.05 * w, "{}: ± {se}", TERMS[t].column);
        }
        assert!(f.r2 > 0.99, "R² {}", f.r2);
        let text = report(&data, &f);
        assert!(text.contains("model = \"linear\"\nread_base = 3."), "{text}");
        // The snippet is a settings file the limiter takes.
        let snippet = &text[text.find("[cost]").unwrap()..];
        tollgate_model::config::Config::parse(snippet).unwrap();
    }

    #[test]
    fn exact_data_fits_exactly() {
        let mut csv = String::from("# per interval\nrequests, cpu_ms, observed\n\n");
        for i in 1..20 {
            let (q, c) = (f64::from(i * 7 % 13 + 1), f64::from(i * i % 17));
            let _ = writeln!(csv, "{q},{c},{}", 2.5 * q + 0.75 * c);
        }
        let f = fit(&parse(&csv, "observed").unwrap()).unwrap();
        assert!(
            (f.coefficients[0].1 - 2.5).abs() < 1e-9 && (f.coefficients[1].1 - 0.75).abs() < 1e-9,
            "{f:?}"
        );
        assert!(f.rms < 1e-9 && (f.r2 - 1.0).abs() < 1e-12);
        assert!(
            report(&parse(&csv, "observed").unwrap(), &f)
                .contains("read_base = 2.5\nwrite_base = 2.5\nper_cpu_ms = 0.75\n")
        );
    }

    #[test]
    fn degenerate_data_is_refused_with_the_reason() {
        let e = |csv: &str| match parse(csv, "observed").and_then(|d| fit(&d)) {
            Ok(f) => panic!("fitted {f:?}"),
            Err(e) => e.to_string(),
        };
        let collinear: String = std::iter::once("reads,read_bytes,observed\n".to_string())
            .chain((1..30).map(|i| format!("{i},{},{}\n", i * 4096, i * 7)))
            .collect();
        assert_eq!(
            e(&collinear),
            "read_bytes is (almost) a combination of reads: the data cannot tell their costs apart; vary them independently, or leave one out"
        );
        assert_eq!(
            e("reads,observed\n1,2\n2,4\n"),
            "2 rows for 1 coefficients: at least 4 are needed (the coefficients plus three)"
        );
        let zeros: String = std::iter::once("reads,cpu_ms,observed\n".to_string())
            .chain((1..30).map(|i| format!("{i},0,{}\n", i * 3)))
            .collect();
        assert_eq!(e(&zeros), "cpu_ms: every row is 0, so its cost cannot be fitted; leave the column out");
        assert!(e("reads,cpu,observed\n").starts_with("line 1: column \"cpu\" is not one the model knows"));
        assert_eq!(
            e("reads\n1\n"),
            "line 1: no column \"observed\" holds the observed resource use (name it with --observed)"
        );
        assert_eq!(
            e("reads,observed\n1,2\n1,x\n"),
            "line 3, column observed: expected a number from 0 to 1e15, got \"x\""
        );
        assert_eq!(e("reads,observed\n1,2,3\n"), "line 2: 3 values for 2 columns");
        assert_eq!(e("requests,reads,observed\n"), "line 1: give requests, or reads and writes, not both");
        assert_eq!(
            e("reads,observed\n1,-2\n"),
            "line 2, column observed: expected a number from 0 to 1e15, got \"-2\""
        );
        assert_eq!(e("# nothing\n"), "the file has no header line");
    }

    #[test]
    fn a_column_that_lowers_the_observed_use_is_left_out() {
        let mut csv = String::from("reads,cpu_ms,observed\n");
        for i in 1..40 {
            let (r, c) = (f64::from(i), f64::from(i * 7 % 11));
            let _ = writeln!(csv, "{r},{c},{}", 5.0 * r - 0.5 * c);
        }
        let data = parse(&csv, "observed").unwrap();
        let f = fit(&data).unwrap();
        assert_eq!(f.dropped.len(), 1);
        assert_eq!(f.coefficients.len(), 1);
        assert!(report(&data, &f).contains("cpu_ms       left out: its cost came out negative"));
    }
}
