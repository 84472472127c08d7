//! `tollgate ramp`: how a ramp-up mode turns a usage pattern into pools, epoch by epoch.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use tollgate_model::ramp::Ramp;
use tollgate_model::settings::{RampMode, RampSettings};

use crate::say;

/// The four modes.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// Grows every epoch, used or not.
    Scheduled,
    /// Grows in every epoch with a call.
    Relaxed,
    /// Grows when the last active epoch used at least the threshold.
    #[value(alias = "only_if_used")]
    OnlyIfUsed,
    /// Grows when used, shrinks when not, and falls back after gaps.
    #[value(alias = "go_back_n")]
    GoBackN,
}

/// `tollgate ramp` arguments.
#[derive(Args, Debug)]
pub struct RampArgs {
    /// The ramp mode.
    #[arg(long, value_enum)]
    mode: ModeArg,
    /// Starting pool, tokens per epoch.
    #[arg(long)]
    min: f64,
    /// Final pool, tokens per epoch.
    #[arg(long)]
    max: f64,
    /// Seconds from min to max when growing every epoch.
    #[arg(long)]
    duration: f64,
    /// Utilisation percent needed to grow (only-if-used, go-back-n).
    #[arg(long, default_value_t = 50.0)]
    threshold: f64,
    /// Seconds without calls before go-back-n falls back.
    #[arg(long, default_value_t = 5.0)]
    cool_down: f64,
    /// Percent of a slope go-back-n falls back per missed epoch.
    #[arg(long, default_value_t = 50.0)]
    ramp_down: f64,
    /// Tokens used per epoch, comma-separated; `-` for an epoch without a call.
    #[arg(long)]
    usage: String,
    /// Also draw the pool and the use as a PNG chart.
    #[arg(long)]
    chart: Option<PathBuf>,
}

/// The ramp the flags describe, or every problem with them, each naming its flag.
fn settings(a: &RampArgs) -> anyhow::Result<RampSettings> {
    let mut problems = Vec::new();
    // Negative or NaN durations cannot even be represented: report them here; zero is one of
    // the settings' own rules.
    if !(a.duration.is_finite() && a.duration >= 0.0) {
        problems.push(format!("--duration: must be above 0 seconds, got {}", a.duration));
    }
    if !(a.cool_down.is_finite() && a.cool_down >= 0.0) {
        problems.push(format!("--cool-down: must be 0 seconds or more, got {}", a.cool_down));
    }
    let seconds =
        |s: f64| std::time::Duration::from_secs_f64(if s.is_finite() && s >= 0.0 { s } else { 0.0 });
    let settings = RampSettings {
        mode: match a.mode {
            ModeArg::Scheduled => RampMode::Scheduled,
            ModeArg::Relaxed => RampMode::Relaxed,
            ModeArg::OnlyIfUsed => RampMode::OnlyIfUsed,
            ModeArg::GoBackN => RampMode::GoBackN,
        },
        threshold_pct: a.threshold,
        ramp_down_pct: a.ramp_down,
        cool_down: seconds(a.cool_down),
        ..RampSettings::new(a.min, a.max, seconds(a.duration))
    };
    if let Err(errors) = settings.validate() {
        for e in errors.0 {
            let flag = match e.field.as_str() {
                "ramp.threshold_pct" => "--threshold",
                "ramp.ramp_down_pct" => "--ramp-down",
                "ramp.duration_s" if !problems.iter().any(|p| p.starts_with("--duration")) => "--duration",
                "ramp.duration_s" => continue,
                "ramp.max" => "--max",
                "ramp.cool_down_s" => "--cool-down",
                "ramp.min" => "--min",
                _ => "--mode",
            };
            problems.push(format!("{flag}: {}", e.rule));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("; "));
    }
    Ok(settings)
}

/// The tokens used per epoch: `None` for an epoch without a call.
fn usage(list: &str) -> anyhow::Result<Vec<Option<f64>>> {
    let mut usage = Vec::new();
    for (i, item) in list.split(',').enumerate() {
        let item = item.trim();
        usage.push(match item {
            "-" => None,
            n => Some(n.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).with_context(|| {
                format!("--usage: entry {} must be a number of tokens or `-`, got {item:?}", i + 1)
            })?),
        });
    }
    Ok(usage)
}

pub fn run(a: RampArgs) -> anyhow::Result<()> {
    let settings = settings(&a)?;
    let usage = usage(&a.usage)?;
    let mut ramp = Ramp::new(settings, None);
    let (mut xs, mut pools, mut used) = (Vec::new(), Vec::new(), Vec::new());
    for (epoch, u) in usage.iter().enumerate() {
        xs.push((epoch + 1) as f64);
        match u {
            None => {
                say(format!("{} - -", epoch + 1));
                pools.push(f64::NAN);
                used.push(f64::NAN);
            }
            Some(u) => {
                let pool = ramp.at_epoch(epoch as u64);
                let took = u.min(pool as f64);
                ramp.use_units(took);
                say(format!("{} {pool} {took}", epoch + 1));
                pools.push(pool as f64);
                used.push(took);
            }
        }
    }
    if let Some(path) = a.chart {
        let mode = clap::ValueEnum::to_possible_value(&a.mode)
            .map_or_else(String::new, |v| v.get_name().to_string());
        let title = format!("ramp {mode}: min {}, max {}, over {} s", a.min, a.max, a.duration);
        let png = tollgate_sim::chart::line_chart(
            &title,
            "tokens per epoch",
            "epoch (one second each)",
            &xs,
            &[("pool".to_string(), pools), ("used".to_string(), used)],
        );
        std::fs::write(&path, png).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
