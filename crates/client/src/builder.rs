//! Building an embedded limiter: from a settings file, its text, or in code.

use std::sync::Arc;
use std::time::Duration;

use tollgate_model::bucket::Bucket;
use tollgate_model::config::{AllocationMode, Config, ConfigError, ConfigErrors, NodeSettings};
use tollgate_model::cost::CostModel;
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_model::time::Clock;

use crate::clock::{ClockSource, MonotonicClock};
use crate::embedded::Embedded;
use crate::error::BuildError;
use crate::group::{Group, Groups, LimiterState};
use crate::handle::Tollgate;
use crate::inner::{Inner, Mode};

/// Builds an embedded [`Tollgate`] from settings described in code or read from a file.
#[derive(Clone, Default)]
pub struct Builder {
    config: Config,
    clock: Option<ClockSource>,
}

/// What [`Builder::build`] refuses in settings that parse, without building anything: a cost
/// model's or the node's values out of range. `tollgate check-config` runs it, so that a file
/// it passes is one the limiter takes.
pub fn check(config: &Config) -> Result<(), BuildError> {
    config.cost_model.validate()?;
    check_node(&config.node)?;
    Ok(())
}

impl Builder {
    /// Starts from a whole configuration (replacing anything set so far).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The node's capacity in units/s.
    pub fn capacity(mut self, units_per_s: f64) -> Self {
        self.config.node.capacity = Some(units_per_s);
        self
    }

    /// How the capacity is shared.
    pub fn mode(mut self, mode: AllocationMode) -> Self {
        self.config.node.mode = mode;
        self
    }

    /// How long `acquire` waits at most.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.config.node.max_wait = max_wait;
        self
    }

    /// How often allowances are recomputed from demand.
    pub fn realloc_interval(mut self, interval: Duration) -> Self {
        self.config.node.realloc_interval = interval;
        self
    }

    /// The cost model used by [`Tollgate::try_acquire_usage`].
    pub fn cost_model(mut self, model: CostModel) -> Self {
        self.config.cost_model = model;
        self
    }

    /// Adds or replaces a group.
    pub fn group(mut self, name: GroupName, settings: GroupSettings) -> Self {
        self.config.groups.insert(name, settings);
        self
    }

    /// The clock (default: [`MonotonicClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(ClockSource::of(clock));
        self
    }

    /// Checks the settings and builds the limiter: the engine in process, fed by this
    /// process's demand.
    pub fn build(self) -> Result<Tollgate, BuildError> {
        let Builder { config, clock } = self;
        check(&config)?;
        let clock = Arc::new(clock.unwrap_or_else(|| ClockSource::of(MonotonicClock::new())));
        let node = config.node.clone();
        let make_clock = clock.clone();
        let make = move |name: GroupName, settings: &GroupSettings| {
            let ceiling = max_rate(settings, &node);
            // Start full at the highest rate the group could have; the engine's first tick,
            // at once, sets its real rate and keeps it full at the new burst.
            let bucket = Bucket::new(ceiling, settings.burst_for(ceiling), make_clock.now());
            let g = Group::new(
                name,
                LimiterState::Bucket(bucket),
                &make_clock,
                settings.burst().unwrap_or(ceiling),
                !node.throttling,
            );
            g.set_policy(crate::group::Policy::of(settings, node.shadow));
            g
        };
        let configured = config.groups.iter().map(|(n, s)| (n.as_str().into(), s.clone())).collect();
        let groups = Arc::new(Groups::new(configured, config.node.max_tracked_groups, Box::new(make)));
        let mode = Mode::Embedded(Box::new(Embedded::new(&config, clock.now(), clock.unix_ms())));
        let inner = Inner::new(clock, groups, mode, config.node, config.cost_model);
        Ok(Tollgate { inner: Arc::new(inner), unthrottled: false })
    }
}

fn check_node(node: &NodeSettings) -> Result<(), BuildError> {
    let mut errors = Vec::new();
    if let Some(c) = node.capacity
        && !(c.is_finite() && c > 0.0)
    {
        errors.push(("capacity", format!("must be a finite number above 0, got {c}")));
    }
    if node.realloc_interval.is_zero() {
        errors.push(("realloc_ms", "must be above 0".to_string()));
    }
    if node.max_tracked_groups == 0 {
        errors.push(("max_tracked_groups", "must be at least 1".to_string()));
    }
    if errors.is_empty() {
        return Ok(());
    }
    let errors = errors
        .into_iter()
        .map(|(field, rule)| ConfigError { line: 0, field: format!("node.{field}"), rule })
        .collect();
    Err(BuildError::Config(ConfigErrors(errors)))
}

/// The most a group can ever be allowed: its reservation, or its limit within the capacity.
fn max_rate(settings: &GroupSettings, node: &NodeSettings) -> f64 {
    let capped = settings.limit().as_f64().min(node.capacity.unwrap_or(f64::INFINITY));
    capped.max(settings.reserved())
}

impl Tollgate {
    /// A builder, to describe groups in code.
    ///
    /// ```
    /// use tollgate_limiter::Tollgate;
    /// use tollgate_model::settings::{GroupName, GroupSettings};
    ///
    /// let gate = Tollgate::builder()
    ///     .capacity(10_000.0)
    ///     .group(GroupName::new("search")?, GroupSettings::builder().reserved(2000.0).build()?)
    ///     .build()?;
    /// assert!(gate.try_acquire("search", 1.0).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// An embedded limiter for a parsed configuration, on the default clock.
    pub fn embedded(config: Config) -> Result<Tollgate, BuildError> {
        Builder::default().config(config).build()
    }

    /// An embedded limiter from the text of a settings file.
    pub fn from_toml(src: &str) -> Result<Tollgate, BuildError> {
        Self::embedded(Config::parse(src)?)
    }

    /// An embedded limiter from a settings file (see `docs/configuration.md`).
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Tollgate, BuildError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path)
            .map_err(|e| BuildError::Read { path: path.to_path_buf(), reason: e.to_string() })?;
        Self::from_toml(&src)
    }

    /// The same embedded limiter's settings, started afresh on another clock (for tests and
    /// simulations). A remote or store handle is refused: its clock is given when it is made
    /// ([`RemoteOptions::with_clock`](crate::RemoteOptions::with_clock),
    /// [`Tollgate::store_with_clock`]).
    pub fn with_clock(&self, clock: impl Clock) -> Result<Tollgate, BuildError> {
        let inner = &self.inner;
        if !matches!(inner.mode, Mode::Embedded(_)) {
            return Err(BuildError::Unsupported {
                mode: inner.mode.name(),
                field: "with_clock".into(),
                reason: "a remote or store handle takes its clock when it is made",
            });
        }
        let mut config =
            Config { node: inner.node.clone(), cost_model: inner.cost_model, ..Config::default() };
        for (name, settings) in inner.groups.configured() {
            config.groups.insert(GroupName::new(name).expect("configured names are valid"), settings.clone());
        }
        Builder::default().config(config).clock(clock).build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_per_window_holds_in_process_within_a_tick_of_grants() {
        use tollgate_model::time::ManualClock;
        let config = Config::parse("[groups.a]\nlimit = 1000\nquotas = { day = 50 }\n").unwrap();
        let clock = ManualClock::new();
        let gate = Builder::default().config(config).clock(clock.clone()).build().unwrap();
        let mut admitted = 0;
        for second in 0..12 {
            for _ in 0..200 {
                admitted += u32::from(gate.try_acquire("a", 1.0).is_ok());
            }
            if second == 2 {
                // By now the engine has seen the day's 50 spent: nothing more from here on.
                assert!((50..=60).contains(&admitted), "{admitted} admitted against a quota of 50");
                admitted = 0;
            }
            clock.advance(std::time::Duration::from_secs(1));
        }
        assert_eq!(admitted, 0, "nothing once the day's quota is spent");
    }

    #[test]
    fn a_pattern_holds_each_group_it_names_to_its_settings_apart() {
        use tollgate_model::time::ManualClock;
        let text = "[groups.\"user-*\"]\nlimit = 10\n[groups.\"user-vip-*\"]\nlimit = 1000\n";
        let config = Config::parse(text).unwrap();
        let clock = ManualClock::new();
        let gate = Builder::default().config(config).clock(clock.clone()).build().unwrap();
        let burst = |g: &str| (0..100).filter(|_| gate.try_acquire(g, 1.0).is_ok()).count();
        // Each user's own second of 10 (its burst); a vip's 1000 has room for all 100.
        assert_eq!(burst("user-ann"), 10);
        assert_eq!(burst("user-bob"), 10, "bob's are his own");
        assert_eq!(burst("user-vip-cy"), 100, "the more specific pattern");
        assert_eq!(burst("other"), 100, "no pattern: the defaults (unlimited)");
    }
}
