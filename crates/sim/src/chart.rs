//! The timeline chart: each group's target and admitted units/s, and each backend's
//! utilisation, over simulated time, as a PNG.
//!
//! Drawn on a plain pixel canvas with a built-in 5×7 font, so the chart needs no font files
//! and no plotting library.

use crate::run::Outcome;

const WIDTH: usize = 1200;
const HEIGHT: usize = 720;
const BG: [u8; 3] = [255, 255, 255];
const AXIS: [u8; 3] = [60, 60, 60];
const GRID: [u8; 3] = [225, 225, 225];
const PALETTE: [[u8; 3]; 8] = [
    [31, 119, 180],
    [214, 39, 40],
    [44, 160, 44],
    [148, 103, 189],
    [255, 127, 14],
    [23, 190, 207],
    [140, 86, 75],
    [227, 119, 194],
];

struct Canvas {
    px: Vec<[u8; 3]>,
}

impl Canvas {
    fn new() -> Self {
        Self { px: vec![BG; WIDTH * HEIGHT] }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..WIDTH as i64).contains(&x) && (0..HEIGHT as i64).contains(&y) {
            self.px[y as usize * WIDTH + x as usize] = c;
        }
    }

    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3], dashed: bool) {
        // Bresenham.
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err, mut n) = (x0, y0, dx + dy, 0u32);
        loop {
            if !dashed || (n / 4) % 2 == 0 {
                self.set(x, y, c);
                self.set(x, y + 1, c);
            }
            n += 1;
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    fn rect(&mut self, x: i64, y: i64, w: i64, h: i64, c: [u8; 3]) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.set(xx, yy, c);
            }
        }
    }

    /// Text at scale 2, top-left at (x, y).
    fn text(&mut self, x: i64, y: i64, s: &str, c: [u8; 3]) {
        for (i, ch) in s.chars().enumerate() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        self.rect(x + i as i64 * 12 + col * 2, y + row as i64 * 2, 2, 2, c);
                    }
                }
            }
        }
    }
}

/// A 5×7 glyph: seven rows, the low five bits of each the columns left to right.
fn glyph(ch: char) -> [u8; 7] {
    match ch.to_ascii_uppercase() {
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        '.' => [0, 0, 0, 0, 0, 0x0C, 0x0C],
        '-' => [0, 0, 0, 0x1F, 0, 0, 0],
        '_' => [0, 0, 0, 0, 0, 0, 0x1F],
        ':' => [0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0],
        '/' => [0, 0x01, 0x02, 0x04, 0x08, 0x10, 0],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '=' => [0, 0, 0x1F, 0, 0x1F, 0, 0],
        ',' => [0, 0, 0, 0, 0x0C, 0x04, 0x08],
        ' ' => [0; 7],
        _ => [0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04],
    }
}

/// A number in a few characters: 409600 → "409.6k".
fn compact(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, "g")
    } else if a >= 1e6 {
        (v / 1e6, "m")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = format!("{x:.1}");
    format!("{}{suffix}", s.strip_suffix(".0").unwrap_or(&s))
}

struct Panel {
    top: i64,
    height: i64,
    left: i64,
    width: i64,
    max_y: f64,
    max_t: f64,
}

impl Panel {
    fn point(&self, t: f64, v: f64) -> (i64, i64) {
        let x = self.left + ((t / self.max_t) * self.width as f64) as i64;
        let y = self.top + self.height - ((v / self.max_y).clamp(0.0, 1.05) * self.height as f64) as i64;
        (x, y)
    }

    fn frame(&self, c: &mut Canvas, label: &str, x_unit: &str) {
        for i in 0..=4 {
            let y = self.top + self.height * i / 4;
            c.line((self.left, y), (self.left + self.width, y), GRID, false);
            let v = self.max_y * (4 - i) as f64 / 4.0;
            c.text(8, y - 7, &compact(v), AXIS);
        }
        c.line((self.left, self.top), (self.left, self.top + self.height), AXIS, false);
        c.line(
            (self.left, self.top + self.height),
            (self.left + self.width, self.top + self.height),
            AXIS,
            false,
        );
        for i in 0..=5 {
            let t = self.max_t * i as f64 / 5.0;
            let (x, y) = self.point(t, 0.0);
            c.text(x - 12, y + 8, &format!("{}{x_unit}", compact(t)), AXIS);
        }
        c.text(self.left + 8, self.top - 20, label, AXIS);
    }

    fn plot(&self, c: &mut Canvas, ts: &[f64], vs: &[f64], color: [u8; 3], dashed: bool) {
        let mut prev: Option<(i64, i64)> = None;
        for (t, v) in ts.iter().zip(vs) {
            if !v.is_finite() {
                prev = None;
                continue;
            }
            let p = self.point(*t, *v);
            if let Some(q) = prev {
                c.line(q, p, color, dashed);
            }
            prev = Some(p);
        }
    }
}

/// A one-panel line chart: `series` of (name, values at `xs`), NaN for a gap, as PNG bytes.
pub fn line_chart(
    title: &str,
    panel: &str,
    x_unit: &str,
    xs: &[f64],
    series: &[(String, Vec<f64>)],
) -> Vec<u8> {
    let mut c = Canvas::new();
    c.text(100, 12, title, AXIS);
    let max_t = xs.last().copied().unwrap_or(1.0).max(1.0);
    let max_y =
        series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|v| v.is_finite()).fold(1.0f64, f64::max);
    let p = Panel { top: 70, height: 600, left: 100, width: 860, max_y: max_y * 1.1, max_t };
    p.frame(&mut c, panel, x_unit);
    for (i, (name, values)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        p.plot(&mut c, xs, values, color, i % 2 == 1);
        let y = 80 + i as i64 * 22;
        c.rect(985, y, 16, 10, color);
        c.text(1008, y - 2, name, AXIS);
    }
    encode(&c)
}

fn encode(c: &Canvas) -> Vec<u8> {
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, WIDTH as u32, HEIGHT as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("writing a PNG header to memory cannot fail");
        let data: Vec<u8> = c.px.iter().flatten().copied().collect();
        writer.write_image_data(&data).expect("writing PNG data to memory cannot fail");
    }
    bytes
}

/// Renders the chart of `outcome` for scenario `name` as PNG bytes.
pub fn render(name: &str, outcome: &Outcome) -> Vec<u8> {
    let mut c = Canvas::new();
    let ts: Vec<f64> = outcome.timeline.iter().map(|s| s.t).collect();
    let max_t = ts.last().copied().unwrap_or(1.0).max(1.0);
    c.text(100, 12, &format!("{name} (seed {})", outcome.seed), AXIS);

    let mut max_units: f64 = 0.0;
    for s in &outcome.timeline {
        for g in &s.groups {
            max_units = max_units.max(g.admitted_units).max(g.target_units.unwrap_or(0.0));
        }
    }
    let top = Panel { top: 70, height: 360, left: 100, width: 860, max_y: (max_units * 1.1).max(1.0), max_t };
    top.frame(&mut c, "units/s: target (solid), admitted (dashed)", "s");
    for (i, g) in outcome.groups.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let target: Vec<f64> =
            outcome.timeline.iter().map(|s| s.groups[i].target_units.unwrap_or(f64::NAN)).collect();
        let admitted: Vec<f64> = outcome.timeline.iter().map(|s| s.groups[i].admitted_units).collect();
        top.plot(&mut c, &ts, &target, color, false);
        top.plot(&mut c, &ts, &admitted, color, true);
        let y = 80 + i as i64 * 22;
        c.rect(985, y, 16, 10, color);
        c.text(1008, y - 2, g.as_str(), AXIS);
    }

    let max_u = outcome.timeline.iter().flat_map(|s| s.utilisation.iter().copied()).fold(1.2f64, f64::max);
    let bottom = Panel { top: 500, height: 170, left: 100, width: 860, max_y: max_u * 1.05, max_t };
    bottom.frame(&mut c, "backend utilisation", "s");
    for (i, b) in outcome.backends.iter().enumerate() {
        let color = PALETTE[(i + outcome.groups.len()) % PALETTE.len()];
        let u: Vec<f64> = outcome.timeline.iter().map(|s| s.utilisation[i]).collect();
        bottom.plot(&mut c, &ts, &u, color, false);
        if i < 8 {
            let y = 510 + i as i64 * 22;
            c.rect(985, y, 16, 10, color);
            c.text(1008, y - 2, b, AXIS);
        }
    }

    encode(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_numbers() {
        assert_eq!(compact(409_600.0), "409.6k");
        assert_eq!(compact(2_000_000.0), "2m");
        assert_eq!(compact(1.25), "1.2");
        assert_eq!(compact(0.0), "0");
    }
}
