//! Charts as PNG, drawn with the `plotters` crate and an embedded font (Inter, SIL Open Font
//! Licence, in `assets/`): the simulator's timeline (each group's target and admitted units/s,
//! each backend's utilisation) and any line chart over time, such as `tollgate ramp`'s.
//!
//! Axes carry round ticks and their units; each series has its own colour (a group's target
//! solid, its admitted units dashed in the same colour) and a legend entry; series that are the
//! same all along are drawn once and named together in the legend, so none hides another
//! unannounced.

use std::sync::Once;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::run::Outcome;

const WIDTH: u32 = 1200;
const LEGEND_WIDTH: u32 = 260;
const FONT: &[u8] = include_bytes!("../assets/Inter-Regular.ttf");
const FAMILY: &str = "sans-serif";

/// Ten colours told apart on a white page (Tableau's ten).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
];

/// One line: its name in the legend, its values at the chart's times (NaN: a gap), dashed or
/// solid, and its colour (an index into the palette).
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The legend's text.
    pub name: String,
    /// A value per time.
    pub values: Vec<f64>,
    /// Dashed rather than solid.
    pub dashed: bool,
    /// Colour: an index into a palette of ten.
    pub color: usize,
}

/// One panel: a title, the unit of its values, its lines, and optionally a reference level
/// drawn as a thin line with its name (such as a backend's target utilisation).
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Above the panel.
    pub title: String,
    /// The y axis's description, units included.
    pub y_desc: String,
    /// The lines.
    pub lines: Vec<Line>,
    /// A level to mark, and its name.
    pub reference: Option<(f64, String)>,
    /// The panel's share of the height (relative to the other panels').
    pub weight: u32,
}

fn font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is part of the binary: it parses, or the build is broken.
        if register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            unreachable!("the embedded font is a valid TrueType file");
        }
    });
}

/// A number with a round suffix: 450000 → "450k", 1250 → "1.25k", 0.5 → "0.5".
pub fn compact(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = format!("{x:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{}{suffix}", if s == "-0" { "0" } else { s })
}

/// Lines that are equal all along merged into one, named together: eight backends at the
/// same utilisation read as one line with eight names, not one name and seven hidden lines.
fn merge_identical(lines: &[Line]) -> Vec<Line> {
    let mut out: Vec<(Line, Vec<String>)> = Vec::new();
    for l in lines {
        let same = |o: &Line| {
            o.dashed == l.dashed
                && o.values.len() == l.values.len()
                && o.values
                    .iter()
                    .zip(&l.values)
                    .all(|(a, b)| (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-9)
        };
        match out.iter_mut().find(|(o, _)| same(o)) {
            Some((_, names)) => names.push(l.name.clone()),
            None => out.push((l.clone(), vec![l.name.clone()])),
        }
    }
    out.into_iter()
        .map(|(mut l, names)| {
            if names.len() > 1 {
                l.name = if names.len() <= 3 {
                    format!("{} (equal)", names.join(", "))
                } else {
                    format!("{} … {} ({} equal)", names[0], names[names.len() - 1], names.len())
                };
            }
            l
        })
        .collect()
}

/// Consecutive finite points: a NaN breaks the line.
fn segments(xs: &[f64], values: &[f64]) -> Vec<Vec<(f64, f64)>> {
    let mut out = vec![Vec::new()];
    for (x, y) in xs.iter().zip(values) {
        if y.is_finite() {
            if let Some(last) = out.last_mut() {
                last.push((*x, *y));
            }
        } else if out.last().is_some_and(|l| !l.is_empty()) {
            out.push(Vec::new());
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_panel(area: &Area<'_>, xs: &[f64], x_desc: &str, p: &Panel) -> Result<(), String> {
    let (chart_area, legend_area) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let max_x = xs.iter().copied().filter(|x| x.is_finite()).fold(1.0f64, f64::max);
    let min_x = xs.iter().copied().filter(|x| x.is_finite()).fold(max_x, f64::min).min(0.0);
    let mut max_y =
        p.lines.iter().flat_map(|l| l.values.iter().copied()).filter(|v| v.is_finite()).fold(0.0, f64::max);
    if let Some((r, _)) = &p.reference {
        max_y = max_y.max(*r);
    }
    let max_y = if max_y > 0.0 { max_y * 1.08 } else { 1.0 };
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(&p.title, (FAMILY, 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(min_x..max_x, 0.0..max_y)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(p.y_desc.as_str())
        .x_labels(12)
        .y_labels(8)
        .x_label_formatter(&|x| compact(*x))
        .y_label_formatter(&|y| compact(*y))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .max_light_lines(1)
        .light_line_style(RGBColor(242, 242, 242))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(|e| e.to_string())?;
    if let Some((r, _)) = &p.reference {
        let line = [(min_x, *r), (max_x, *r)];
        chart
            .draw_series(LineSeries::new(line, BLACK.mix(0.35).stroke_width(1)))
            .map_err(|e| e.to_string())?;
    }
    let lines = merge_identical(&p.lines);
    // Markers every `every` points, each line at its own phase, so that lines running on top
    // of each other for a while still show each of them.
    let every = (xs.len() / 12).max(1);
    for (i, l) in lines.iter().enumerate() {
        let color = PALETTE[l.color % PALETTE.len()];
        let style = color.stroke_width(2);
        for seg in segments(xs, &l.values) {
            if l.dashed {
                chart.draw_series(DashedLineSeries::new(seg, 7, 5, style)).map_err(|e| e.to_string())?;
            } else {
                chart.draw_series(LineSeries::new(seg, style)).map_err(|e| e.to_string())?;
            }
        }
        let points = xs
            .iter()
            .zip(&l.values)
            .enumerate()
            .filter(|(k, (_, y))| y.is_finite() && k % every == (i * every / lines.len().max(1)) % every)
            .map(|(_, (x, y))| (*x, *y));
        // The `i`th line's marker: a circle, a triangle, a square or a cross.
        let (fill, thin) = (color.filled(), color.stroke_width(2));
        match i % 4 {
            0 => chart.draw_series(points.map(|p| Circle::new(p, 4, fill))).map(drop),
            1 => chart.draw_series(points.map(|p| TriangleMarker::new(p, 5, fill))).map(drop),
            2 => chart
                .draw_series(points.map(|p| EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], fill)))
                .map(drop),
            _ => chart.draw_series(points.map(|p| Cross::new(p, 4, thin))).map(drop),
        }
        .map_err(|e| e.to_string())?;
    }
    // The legend beside the chart: a sample of each line and its name.
    let mut y = 48;
    let text = (FAMILY, 14).into_font().color(&RGBColor(40, 40, 40));
    let mut entries: Vec<(Option<(RGBColor, bool)>, String)> =
        lines.iter().map(|l| (Some((PALETTE[l.color % PALETTE.len()], l.dashed)), l.name.clone())).collect();
    let marked = entries.len().min(lines.len());
    if let Some((r, name)) = &p.reference {
        entries.push((None, format!("{name} ({})", compact(*r))));
    }
    for (k, (sample, name)) in entries.into_iter().enumerate() {
        if y > legend_area.dim_in_pixel().1 as i32 - 16 {
            legend_area.draw(&Text::new("…", (8, y), text.clone())).map_err(|e| e.to_string())?;
            break;
        }
        let (color, dashed) = sample.unwrap_or((RGBColor(150, 150, 150), false));
        if dashed {
            for x in (8..38).step_by(12) {
                legend_area
                    .draw(&PathElement::new(vec![(x, y + 8), (x + 7, y + 8)], color.stroke_width(2)))
                    .map_err(|e| e.to_string())?;
            }
        } else {
            legend_area
                .draw(&PathElement::new(vec![(8, y + 8), (38, y + 8)], color.stroke_width(2)))
                .map_err(|e| e.to_string())?;
        }
        if k < marked {
            let at = (23, y + 8);
            match k % 4 {
                0 => legend_area.draw(&Circle::new(at, 4, color.filled())),
                1 => legend_area.draw(&TriangleMarker::new(at, 5, color.filled())),
                2 => legend_area
                    .draw(&Rectangle::new([(at.0 - 4, at.1 - 4), (at.0 + 4, at.1 + 4)], color.filled())),
                _ => legend_area.draw(&Cross::new(at, 4, color.stroke_width(2))),
            }
            .map_err(|e| e.to_string())?;
        }
        legend_area.draw(&Text::new(name, (46, y), text.clone())).map_err(|e| e.to_string())?;
        y += 22;
    }
    Ok(())
}

/// A chart of `panels` stacked over the times `xs` (described by `x_desc`), under `title`, as
/// PNG bytes.
pub fn draw(title: &str, x_desc: &str, xs: &[f64], panels: &[Panel]) -> Vec<u8> {
    font();
    let weights: u32 = panels.iter().map(|p| p.weight.max(1)).sum::<u32>().max(1);
    let height = 60 + weights * 100;
    let mut buf = vec![255u8; (WIDTH * height * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, height)).into_drawing_area();
        let drawn = (|| -> Result<(), String> {
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let (head, mut rest) = root.split_vertically(50);
            head.draw(&Text::new(title, (16, 14), (FAMILY, 22).into_font())).map_err(|e| e.to_string())?;
            for p in panels {
                let h = p.weight.max(1) * 100;
                let (this, below) = rest.split_vertically(h);
                draw_panel(&this, xs, x_desc, p)?;
                rest = below;
            }
            root.present().map_err(|e| e.to_string())
        })();
        if let Err(e) = drawn {
            // Drawing into memory fails only on a bug in the data given (such as a NaN axis):
            // keep what was drawn and say so on the chart's own image.
            let _ =
                root.draw(&Text::new(format!("chart incomplete: {e}"), (16, 32), (FAMILY, 14).into_font()));
        }
    }
    encode(&buf, WIDTH, height)
}

fn encode(rgb: &[u8], width: u32, height: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("writing a PNG header to memory cannot fail");
        writer.write_image_data(rgb).expect("writing PNG data to memory cannot fail");
    }
    bytes
}

/// A one-panel line chart over time: `series` of (name, values at `xs`), NaN for a gap, the
/// second and every other one dashed, as PNG bytes.
pub fn line_chart(
    title: &str,
    y_desc: &str,
    x_desc: &str,
    xs: &[f64],
    series: &[(String, Vec<f64>)],
) -> Vec<u8> {
    let lines = series
        .iter()
        .enumerate()
        .map(|(i, (name, values))| Line {
            name: name.clone(),
            values: values.clone(),
            dashed: i % 2 == 1,
            color: i,
        })
        .collect();
    let panel = Panel { title: String::new(), y_desc: y_desc.to_string(), lines, reference: None, weight: 5 };
    draw(title, x_desc, xs, &[panel])
}

/// Renders the chart of `outcome` for scenario `name` as PNG bytes: each group's target
/// (solid) and admitted units (dashed, same colour), each backend's utilisation beside its
/// target of 1, and for a queueing backend the capacity it learned beside what it served, its
/// learned limit and its latency.
pub fn render(name: &str, outcome: &Outcome) -> Vec<u8> {
    let ts: Vec<f64> = outcome.timeline.iter().map(|s| s.t).collect();
    let mut groups = Vec::new();
    for (i, g) in outcome.groups.iter().enumerate() {
        let target = outcome.timeline.iter().map(|s| s.groups[i].target_units.unwrap_or(f64::NAN)).collect();
        let admitted = outcome.timeline.iter().map(|s| s.groups[i].admitted_units).collect();
        groups.push(Line { name: format!("{g} target"), values: target, dashed: false, color: i });
        groups.push(Line { name: format!("{g} admitted"), values: admitted, dashed: true, color: i });
    }
    let mut panels = vec![Panel {
        title: "groups: target (solid) and admitted (dashed)".into(),
        y_desc: "units/s".into(),
        lines: groups,
        reference: None,
        weight: 5,
    }];
    if !outcome.backends.is_empty() {
        let lines = outcome
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| Line {
                name: b.clone(),
                values: outcome.timeline.iter().map(|s| s.utilisation[i]).collect(),
                dashed: false,
                color: i + outcome.groups.len(),
            })
            .collect();
        panels.push(Panel {
            title: "backends: utilisation".into(),
            y_desc: "utilisation (1 = at target)".into(),
            lines,
            reference: Some((1.0, "target".into())),
            weight: 3,
        });
    }
    panels.extend(learned_panels(outcome));
    draw(&format!("{name} (seed {})", outcome.seed), "simulated time (s)", &ts, &panels)
}

/// For the queueing backends, if any: the capacity each learned (solid) beside what it served
/// (dashed), and its learned limit beside the latency of the work it served.
fn learned_panels(outcome: &Outcome) -> Vec<Panel> {
    let queueing: Vec<(usize, &String)> = outcome
        .backends
        .iter()
        .enumerate()
        .filter(|(i, _)| outcome.timeline.iter().any(|s| s.served[*i].is_some()))
        .collect();
    if queueing.is_empty() {
        return Vec::new();
    }
    let series = |i: usize, f: fn(&crate::world::Served) -> f64| -> Vec<f64> {
        outcome.timeline.iter().map(|s| s.served[i].as_ref().map_or(f64::NAN, f)).collect()
    };
    let color = |n: usize| outcome.groups.len() + outcome.backends.len() + n;
    let mut rates = Vec::new();
    let mut limits = Vec::new();
    let mut latencies = Vec::new();
    for (n, (i, b)) in queueing.into_iter().enumerate() {
        let line = |what: &str, f: fn(&crate::world::Served) -> f64, dashed: bool| Line {
            name: format!("{b} {what}"),
            values: series(i, f),
            dashed,
            color: color(n),
        };
        rates.push(line("learned", |q| q.capacity, false));
        rates.push(line("served", |q| q.goodput, true));
        limits.push(line("limit", |q| q.limit, false));
        latencies.push(line("latency", |q| q.latency_ms, false));
    }
    vec![
        Panel {
            title: "capacity learned (solid) and served (dashed)".into(),
            y_desc: "requests/s".into(),
            lines: rates,
            reference: None,
            weight: 3,
        },
        Panel {
            title: "learned limit".into(),
            y_desc: "requests in flight".into(),
            lines: limits,
            reference: None,
            weight: 2,
        },
        Panel {
            title: "latency of the work served".into(),
            y_desc: "ms".into(),
            lines: latencies,
            reference: None,
            weight: 2,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_numbers_are_round() {
        assert_eq!(compact(450_000.0), "450k");
        assert_eq!(compact(409_600.0), "409.6k");
        assert_eq!(compact(1_250.0), "1.25k");
        assert_eq!(compact(2_000_000.0), "2M");
        assert_eq!(compact(0.5), "0.5");
        assert_eq!(compact(0.0), "0");
    }

    #[test]
    fn identical_lines_are_drawn_once_and_named_together() {
        let line =
            |name: &str, v: f64| Line { name: name.into(), values: vec![v, v], dashed: false, color: 0 };
        let merged = merge_identical(&[line("a", 1.0), line("b", 1.0), line("c", 2.0)]);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].name, "a, b (equal)");
        let many: Vec<Line> = (1..=8).map(|i| line(&format!("db-{i}"), 0.5)).collect();
        assert_eq!(merge_identical(&many)[0].name, "db-1 … db-8 (8 equal)");
    }

    #[test]
    fn a_chart_is_a_png_of_the_size_asked() {
        let xs: Vec<f64> = (0..60).map(f64::from).collect();
        let ys: Vec<f64> = xs.iter().map(|x| if *x == 30.0 { f64::NAN } else { x * 1000.0 }).collect();
        let png = line_chart("t", "units/s", "s", &xs, &[("pool".into(), ys.clone()), ("used".into(), ys)]);
        assert_eq!(&png[1..4], b"PNG");
        let decoder = png::Decoder::new(std::io::Cursor::new(&png));
        let reader = decoder.read_info().unwrap();
        assert_eq!((reader.info().width, reader.info().height), (WIDTH, 60 + 500));
    }
}
