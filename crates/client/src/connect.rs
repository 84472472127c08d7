//! Building a limiter fed from outside the process: by a controller (remote mode) or through
//! Redis (store mode).

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_model::bucket::Bucket;
use tollgate_model::config::{Config, NodeSettings};
use tollgate_model::epoch::EpochShare;
use tollgate_model::settings::{DEFAULT_GROUP, GroupName, GroupSettings};
use tollgate_model::time::Clock;

use crate::clock::{ClockSource, MonotonicClock};
use crate::error::BuildError;
use crate::group::{Group, Groups, LimiterState};
use crate::handle::Tollgate;
use crate::inner::{Inner, Mode};
use crate::remote::{Driver, Link, RemoteOptions};
use crate::store::{self, StoreOptions};

impl Tollgate {
    /// A client of `tollgate server` at `url` (such as `http://127.0.0.1:7460`): the same
    /// API, fed by the controller's grants. Several controllers sharing one etcd are given
    /// comma-separated (`http://a:7460,http://b:7460`): the client talks to the first, and
    /// moves to the next address when one fails; with the groups sharded over them, it sends
    /// each group's part to the group's owner itself ([`crate::shards`]).
    /// Must be called inside a tokio runtime, where the exchange task runs; it stops when the
    /// last handle is dropped. See [`crate::remote`].
    pub fn remote(url: &str, opts: RemoteOptions) -> Result<Tollgate, BuildError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let urls: Vec<&str> = url.split(',').map(str::trim).collect();
        if urls.len() > crate::remote::CONTROLLERS_MAX || urls.iter().any(|u| u.is_empty()) {
            return Err(BuildError::Remote {
                url: url.to_string(),
                reason: format!(
                    "give 1 to {} controller URLs, comma-separated, none empty",
                    crate::remote::CONTROLLERS_MAX
                ),
            });
        }
        let mut channels = Vec::with_capacity(urls.len());
        for u in urls {
            let channel = opts
                .access
                .channel(u, opts.exchange_timeout)
                .map_err(|reason| BuildError::Remote { url: u.to_string(), reason })?;
            channels.push((u.to_string(), channel));
        }
        let timeout = opts.exchange_timeout;
        let routes = crate::shards::Routes::new(opts.access.clone(), timeout);
        let (gate, driver) = Self::remote_driven(opts)?;
        let controllers = crate::remote::Controllers::new(channels, Some(routes));
        runtime.spawn(crate::remote::run(driver, controllers, timeout));
        Ok(gate)
    }

    /// A remote client over a channel made by the caller: any transport tonic can carry, such
    /// as a simulated network in tests (`Endpoint::connect_with_connector`). Must be called
    /// inside a tokio runtime.
    pub fn remote_channel(
        channel: tonic::transport::Channel,
        opts: RemoteOptions,
    ) -> Result<Tollgate, BuildError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        let timeout = opts.exchange_timeout;
        let bearer =
            opts.access.bearer().map_err(|reason| BuildError::Remote { url: String::new(), reason })?;
        let channel = tonic::service::interceptor::InterceptedService::new(
            tollgate_proto::frames::EndKnownCalls(channel),
            bearer,
        );
        let (gate, driver) = Self::remote_driven(opts)?;
        let controllers = crate::remote::Controllers::new(vec![(String::new(), channel)], None);
        runtime.spawn(crate::remote::run(driver, controllers, timeout));
        Ok(gate)
    }

    /// A remote client whose exchanges the caller makes: ask the [`Driver`] for each request
    /// when it is due, deliver it to a controller, and hand the answer back. `tollgate sim`
    /// runs clients this way, in virtual time; no runtime is needed.
    pub fn remote_driven(opts: RemoteOptions) -> Result<(Tollgate, Driver), BuildError> {
        opts.cost_model.validate()?;
        if opts.max_tracked_groups == 0 {
            return Err(BuildError::Remote {
                url: String::new(),
                reason: "max_tracked_groups: must be at least 1".into(),
            });
        }
        let clock = Arc::new(match &opts.clock {
            Some(c) => ClockSource::Custom(c.clone()),
            None => ClockSource::of(MonotonicClock::new()),
        });
        let link = Arc::new(Link::new(&opts));
        let make_clock = clock.clone();
        let make = move |name: GroupName, _: &GroupSettings| {
            // Closed until the controller's first grant, asked for at once; the controller
            // decides what a group may bank.
            let g = Group::new(
                name,
                LimiterState::Bucket(Bucket::closed_until_rated(make_clock.now())),
                &make_clock,
                f64::INFINITY,
                false,
            );
            g.allowance.store(f64::NAN.to_bits(), std::sync::atomic::Ordering::Relaxed);
            g
        };
        let groups = Arc::new(Groups::new(HashMap::new(), opts.max_tracked_groups, Box::new(make)));
        let node = NodeSettings {
            max_wait: opts.max_wait,
            max_tracked_groups: opts.max_tracked_groups,
            ..NodeSettings::default()
        };
        let driver =
            Driver::new(Arc::downgrade(&groups), link.clone(), clock.clone(), opts.group_idle_expiry)
                .with_period(opts.exchange_period);
        let inner = Inner::new(clock, groups, Mode::Remote(link), node, opts.cost_model);
        Ok((Tollgate { inner: Arc::new(inner), unthrottled: false }, driver))
    }

    /// A limiter whose groups share their pools with every other client of the same Redis
    /// and namespace, with no controller. `config` gives the groups: each group with a finite
    /// limit or a ramp is coordinated (its limit, or its ramp, is the pool per epoch); groups
    /// without either are not throttled. Quotas per window are counters in Redis, each
    /// process admitting from what it took of them (see `docs/store.md`). Settings that need
    /// a controller (a capacity, `fcfs`, a parent) or do not apply (a burst) are refused.
    /// Must be called inside a tokio
    /// runtime; returns within `connect_timeout` even when Redis is unreachable (in safe mode
    /// then).
    pub async fn store(url: &str, config: Config, opts: StoreOptions) -> Result<Tollgate, BuildError> {
        Self::store_with_clock(url, config, opts, MonotonicClock::new()).await
    }

    /// [`Tollgate::store`] on a given clock (epochs follow it; tests use a manual clock).
    pub async fn store_with_clock(
        url: &str,
        config: Config,
        opts: StoreOptions,
        clock: impl Clock,
    ) -> Result<Tollgate, BuildError> {
        tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        config.cost_model.validate()?;
        let (link, shares, connection) = store::register(url, &config, opts).await?;
        let (gate, link) = Self::shared_pools(config, link, shares, clock);
        store::start(&link, &gate.inner.groups, connection);
        Ok(gate)
    }

    /// A limiter with no controller and no store (Numaflow's "optionally remove external
    /// store"): each group with a finite limit or a ramp takes its pool divided by the number
    /// of replicas the deployment runs, `replicas` or else the `TOLLGATE_REPLICAS`
    /// environment variable (1 to 100,000). The settings store mode refuses are refused here
    /// too. Exact as long as the count is right: a replica more than counted over-admits,
    /// one fewer under-admits; store mode agrees on the count instead.
    ///
    /// ```
    /// # use tollgate_limiter::Tollgate;
    /// # use tollgate_model::config::Config;
    /// let config = Config::parse("[groups.ingest]\nlimit = 1000\n")?;
    /// let gate = Tollgate::replicas(config, Some(4))?; // 250 units/s in this process
    /// assert_eq!(gate.mode(), "replicas");
    /// assert_eq!(gate.store_status().unwrap().groups[0].size, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replicas(config: Config, replicas: Option<u64>) -> Result<Tollgate, BuildError> {
        Self::replicas_with_clock(config, replicas, MonotonicClock::new())
    }

    /// [`Tollgate::replicas`] on a given clock (epochs follow it).
    pub fn replicas_with_clock(
        config: Config,
        replicas: Option<u64>,
        clock: impl Clock,
    ) -> Result<Tollgate, BuildError> {
        config.cost_model.validate()?;
        let (link, shares, _) = store::fixed(&config, replicas)?;
        Ok(Self::shared_pools(config, link, shares, clock).0)
    }

    /// A handle whose coordinated groups take epoch shares of their pools.
    fn shared_pools(
        config: Config,
        link: store::StoreLink,
        shares: HashMap<GroupName, (tollgate_model::epoch::PoolSpec, u64)>,
        clock: impl Clock,
    ) -> (Tollgate, Arc<store::StoreLink>) {
        let clock = Arc::new(ClockSource::of(clock));
        let make_clock = clock.clone();
        let shares = Arc::new(shares);
        let (shadow, open) = (config.node.shadow, !config.node.throttling);
        let make = move |name: GroupName, settings: &GroupSettings| {
            let limiter = match shares.get(&name) {
                Some((spec, size)) => LimiterState::Epoch(Box::new(EpochShare::new(spec.clone(), *size))),
                None => LimiterState::Bucket(Bucket::new(f64::INFINITY, f64::INFINITY, make_clock.now())),
            };
            let g = Group::new(name, limiter, &make_clock, f64::INFINITY, open);
            g.set_policy(crate::group::Policy::of(settings, shadow));
            g.allowance.store(f64::INFINITY.to_bits(), std::sync::atomic::Ordering::Relaxed);
            crate::store_quota::StoreQuotas::made(&g, settings, make_clock.now());
            g
        };
        // Names outside the settings share the default group's state.
        let max =
            config.groups.len() + usize::from(!config.groups.keys().any(|g| g.as_str() == DEFAULT_GROUP));
        let configured = config.groups.iter().map(|(n, s)| (n.as_str().into(), s.clone())).collect();
        let groups = Arc::new(Groups::new(configured, max, Box::new(make)));
        let link = Arc::new(link);
        let node = NodeSettings { max_tracked_groups: max, ..config.node };
        link.quotas.start(clock.now(), crate::embedded::wall_ms(&*clock));
        let inner = Inner::new(clock, groups, Mode::Store(link.clone()), node, config.cost_model);
        (Tollgate { inner: Arc::new(inner), unthrottled: false }, link)
    }
}
