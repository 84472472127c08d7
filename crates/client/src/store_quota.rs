//! Quotas per window in store and replicas modes: counts, never overrun, with no controller.
//!
//! A group with quotas admits from an allotment, as in the other modes (see
//! [`tollgate_model::engine::Allotment`]); here the allotments come from Redis or, in replicas
//! mode, from this process's share of each quota:
//!
//! - **store mode**: each window of each group is a counter in Redis. A process takes units
//!   from every counter of a group at once, by a Lua script that takes only what each window
//!   has left (the tightest decides), so the processes together never take more than a quota;
//!   what a process takes counts as used at once, and what it has not used when the window ends
//!   is lost (under-admission, never over). Windows on the clock are named by their start, read
//!   from this process's wall clock; a window from the first request is a counter that expires
//!   `N` seconds after the first take made it.
//! - **replicas mode**: each process counts its own `1 / replicas` of each quota, in memory.
//!
//! A process takes more when its allotment runs out (its next sync, in store mode; at once in
//! replicas mode), a small part of what is left each time (half of it, at most its need), so
//! that other processes still find some.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;
use tollgate_model::config::Config;
use tollgate_model::engine::{ALLOTMENT_MIN, Allotment};
use tollgate_model::settings::{BudgetPeriod, GroupName, GroupSettings};
use tollgate_model::time::{Clock as _, Nanos};

use crate::group::{Group, Groups};

/// One group's quotas, and what this process counted of each window (replicas mode).
#[derive(Debug)]
struct QuotaGroup {
    name: GroupName,
    windows: Vec<(BudgetPeriod, f64)>,
    /// Replicas mode: each window's start and the units this process took in it.
    taken: Mutex<Vec<(u64, f64)>>,
    /// Store mode: the units the last take asked for; doubled each time an allotment runs
    /// out before the next sync, so a busy process soon asks for what it spends in one.
    last_want: Mutex<f64>,
}

impl QuotaGroup {
    /// The script call that takes `want` units of this group's windows at `wall`, with its
    /// counters under `prefix`; and the start of the latest window on the clock (0 without one).
    fn take(&self, prefix: &str, wall: u64, want: f64) -> (redis::ScriptInvocation<'static>, u64) {
        let mut invocation = TAKE_SCRIPT.prepare_invoke();
        let mut epoch = 0u64;
        for (w, _) in &self.windows {
            let key = match w {
                BudgetPeriod::Total => format!("{prefix}q:total"),
                BudgetPeriod::FromFirst(s) => format!("{prefix}q:{s}s-from-first"),
                _ => {
                    epoch = epoch.max(w.start_of(wall));
                    format!("{prefix}q:{}:{}", w.name(), w.start_of(wall))
                }
            };
            invocation.key(key);
        }
        for (_, units) in &self.windows {
            invocation.arg(*units);
        }
        for (w, _) in &self.windows {
            let span = match w {
                BudgetPeriod::Total => 0,
                BudgetPeriod::FromFirst(_) => w.span_ms(),
                _ => w.end_of(wall).map_or(0, |e| e.saturating_sub(wall)) + 60_000,
            };
            invocation.arg(span);
        }
        invocation.arg(want);
        (invocation, epoch)
    }
}

/// The groups with quotas of a store-mode or replicas-mode limiter.
#[derive(Debug)]
pub(crate) struct StoreQuotas {
    groups: Vec<QuotaGroup>,
    /// Replicas mode: each quota divided by this; `None` in store mode.
    replicas: Option<u64>,
    /// The wall clock (Unix ms) at a reading of the limiter's clock: windows are placed on it.
    wall: Mutex<(Nanos, u64)>,
    /// Store mode: an allotment ran out; the sync task takes more at once.
    wanted: Notify,
    /// Store mode: the sync task has taken (or failed to take) more.
    answered: Notify,
}

/// The most a process asks for at once, in units, before it is known how fast it spends.
const FIRST_TAKE: f64 = 1.0;

/// The most a process asks for at once, in units.
const WANT_MAX: f64 = 1e12;

/// How long to say a spent quota over a group's life stays spent: only how often to look.
const LIFE_SPENT_MS: u64 = tollgate_model::engine::LIFE_SPENT_RETRY.as_millis() as u64;

/// A window's take, run on Redis: `KEYS` one counter per window, `ARGV` the quota of each, then
/// the milliseconds until each ends (0: a window from the first request, whose counter lives
/// `ARGV` span ms from its first take), then how many units are wanted. Takes the most it can,
/// at most half of what the tightest window has left (at least one unit while one is left),
/// from every counter; returns the units taken, what is left after, and the milliseconds until
/// the tightest window ends.
const TAKE: &str = r"
local n = #KEYS
local want = tonumber(ARGV[2 * n + 1])
local left, ends = nil, nil
for i = 1, n do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  local room = tonumber(ARGV[i]) - used
  if left == nil or room < left then left = room end
end
if left < 0 then left = 0 end
local take = math.min(want, math.max(math.min(1, left), math.floor(left / 2)))
if left >= 1 then take = math.max(math.floor(take), math.min(1, left)) end
for i = 1, n do
  local span = tonumber(ARGV[n + i])
  if take > 0 then redis.call('INCRBYFLOAT', KEYS[i], take) end
  local ttl = redis.call('PTTL', KEYS[i])
  if span > 0 and ttl < 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], span)
    ttl = span
  end
  if ttl > 0 and (ends == nil or ttl < ends) then ends = ttl end
end
return {tostring(take), tostring(left - take), ends or 0}
";

static TAKE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(TAKE));

impl StoreQuotas {
    /// The quotas of `config`'s groups; `replicas` in replicas mode. Their windows are placed
    /// on the wall clock when the limiter [starts](Self::start).
    pub(crate) fn of(config: &Config, replicas: Option<u64>) -> StoreQuotas {
        let groups = config
            .groups
            .iter()
            .filter(|(_, s)| s.has_quotas())
            .map(|(name, s)| QuotaGroup {
                name: name.clone(),
                windows: s.quotas().collect(),
                taken: Mutex::default(),
                last_want: Mutex::new(FIRST_TAKE),
            })
            .collect();
        StoreQuotas {
            groups,
            replicas,
            wall: Mutex::new((Nanos(0), 0)),
            wanted: Notify::new(),
            answered: Notify::new(),
        }
    }

    /// Whether any group has quotas.
    pub(crate) fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    fn wall_at(&self, now: Nanos) -> u64 {
        let (at, wall) = *self.wall.lock().unwrap_or_else(PoisonError::into_inner);
        wall.saturating_add(u64::try_from(now.since(at).as_millis()).unwrap_or(u64::MAX))
    }

    /// Places the windows: the limiter's clock reads `now` at the Unix time `wall_ms`.
    pub(crate) fn start(&self, now: Nanos, wall_ms: u64) {
        *self.wall.lock().unwrap_or_else(PoisonError::into_inner) = (now, wall_ms);
    }

    /// Marks a group just made as admitting from an allotment if it has quotas, holding none
    /// yet: its first request asks for one.
    pub(crate) fn made(g: &Group, settings: &GroupSettings, now: Nanos) {
        if settings.has_quotas() {
            let none =
                Allotment { window: 0, add: 0.0, ends_in: Some(Duration::ZERO), left: 1.0, reset_in: None };
            g.set_allotment(Some(&none), now, now);
        }
    }

    /// Replicas mode: `group`'s allotment of this process's share, renewed at once.
    pub(crate) fn refill_local(&self, g: &Group, now: Nanos) {
        let (Some(n), Some(q)) = (self.replicas, self.groups.iter().find(|q| q.name == g.name)) else {
            return;
        };
        let wall = self.wall_at(now);
        let mut taken = q.taken.lock().unwrap_or_else(PoisonError::into_inner);
        if taken.len() != q.windows.len() {
            *taken = vec![(u64::MAX, 0.0); q.windows.len()];
        }
        // Each window's start and end now.
        let spans: Vec<(u64, Option<u64>)> = q
            .windows
            .iter()
            .zip(taken.iter())
            .map(|((w, _), (start, _))| match w {
                // Starts at the first take after the last one ended.
                BudgetPeriod::FromFirst(_) => {
                    let s = if *start != u64::MAX && wall < start.saturating_add(w.span_ms()) {
                        *start
                    } else {
                        wall
                    };
                    (s, Some(s.saturating_add(w.span_ms())))
                }
                _ => (w.start_of(wall), w.end_of(wall)),
            })
            .collect();
        let epoch = spans.iter().map(|(s, _)| *s).max().unwrap_or(0);
        let ends = spans.iter().filter_map(|(_, e)| *e).min();
        // A new allotment drops what the group held unused of the last one: it is not used
        // in the windows still under way.
        let (window, unused) = g.allotment_unused();
        let returned = if window == epoch { 0.0 } else { unused };
        let mut left = f64::INFINITY;
        for (((_, units), (start, used)), (s, _)) in q.windows.iter().zip(taken.iter_mut()).zip(&spans) {
            if *start == *s {
                *used = (*used - returned).max(0.0);
            } else {
                (*start, *used) = (*s, 0.0);
            }
            left = left.min(units / n as f64 - *used);
        }
        // A single process needs no sharing: all of its share at once, in whole units.
        let add = if left >= 1.0 { left.floor() } else { left.max(0.0) };
        // The windows this leaves with less than a unit: when the last of them ends.
        let mut spent_until: Option<u64> = None;
        for (((_, units), (_, used)), (_, end)) in q.windows.iter().zip(taken.iter_mut()).zip(&spans) {
            *used += add;
            if units / n as f64 - *used < ALLOTMENT_MIN {
                spent_until = Some(spent_until.unwrap_or(0).max(end.unwrap_or(wall + LIFE_SPENT_MS)));
            }
        }
        let allotment = Allotment {
            window: epoch,
            add,
            ends_in: ends.map(|e| Duration::from_millis(e.saturating_sub(wall))),
            left: 0.0,
            reset_in: spent_until.map(|e| Duration::from_millis(e.saturating_sub(wall))),
        };
        g.set_allotment(Some(&allotment), now, now);
    }

    /// Store mode: asks the sync task to take more at once (`group`'s allotment ran out).
    pub(crate) fn wake(&self) {
        self.wanted.notify_one();
    }

    /// Store mode: waits until the sync task is asked to take more, or its next sync.
    pub(crate) async fn wanted(&self) {
        self.wanted.notified().await;
    }

    /// Store mode: wakes every caller waiting for the sync task to take more.
    pub(crate) fn answer(&self) {
        self.answered.notify_waiters();
    }

    /// Store mode: waits for the next take of `g`'s allotment, asking for one if `g` holds
    /// none and the store has some left (or its window ended); at once if `g` holds some, or
    /// nothing is left.
    pub(crate) async fn answered(&self, g: &Group) {
        let answered = self.answered.notified();
        tokio::pin!(answered);
        // Registered before the look, so an answer between the two is not missed.
        answered.as_mut().enable();
        let now = g.clock.now();
        let ended = g.allotment_ends().is_some_and(|end| now >= end);
        match g.allotment(now) {
            Some((held, beyond, _)) if held <= 0.0 && (beyond > 0.0 || ended) => {
                g.want_allotment();
                self.wake();
                answered.await;
            }
            _ => {}
        }
    }

    /// Store mode: takes more for each group whose allotment ran out (or is nearly out), from
    /// the counters in Redis under each group's `prefix`. `false` when Redis did not answer.
    pub(crate) async fn refill(
        &self,
        c: &mut MultiplexedConnection,
        prefix: impl Fn(&GroupName) -> String,
        groups: &Arc<Groups>,
    ) -> bool {
        for q in &self.groups {
            let Some(g) = groups.get(q.name.as_str()) else { continue };
            let now = g.clock.now();
            let wall = self.wall_at(now);
            let Some((held, _, _)) = g.allotment(now) else { continue };
            let live = g.allotment_ends().is_none_or(|end| now < end);
            let asked = g.take_allot_wanted();
            let want = {
                let mut last = q.last_want.lock().unwrap_or_else(PoisonError::into_inner);
                // Taken ahead only while in use: an idle process takes nothing of a new window.
                if !asked && (!live || held >= *last / 2.0) {
                    continue;
                }
                *last = if asked && live { (*last * 2.0).min(WANT_MAX) } else { *last };
                *last
            };
            let (invocation, epoch) = q.take(&prefix(&q.name), wall, want);
            let call = invocation.invoke_async::<(String, String, u64)>(c);
            let Ok(Ok((take, left, ends))) = tokio::time::timeout(Duration::from_secs(1), call).await else {
                return false;
            };
            let (take, left): (f64, f64) = (take.parse().unwrap_or(0.0), left.parse().unwrap_or(0.0));
            // A window on the clock ends with the clock; one from the first request when its
            // counter expires (its end is then its name).
            let clock_end = q.windows.iter().filter_map(|(w, _)| match w {
                BudgetPeriod::Total | BudgetPeriod::FromFirst(_) => None,
                _ => w.end_of(wall),
            });
            // Named to the second: a counter's end read at two takes differs by their distance.
            let first_end = (ends > 0
                && q.windows.iter().any(|(w, _)| matches!(w, BudgetPeriod::FromFirst(_))))
            .then(|| (wall + ends).div_ceil(1000) * 1000);
            let end = clock_end.chain(first_end).min();
            let window = if epoch > 0 { epoch } else { first_end.unwrap_or(0) };
            let allotment = Allotment {
                window,
                add: take,
                ends_in: end.map(|e| Duration::from_millis(e.saturating_sub(wall))),
                left,
                reset_in: (left <= 0.0)
                    .then(|| Duration::from_millis(end.unwrap_or(wall + LIFE_SPENT_MS).saturating_sub(wall))),
            };
            g.set_allotment(Some(&allotment), now, now);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    /// The Python client's store mode takes its quotas' units by the same script, so that
    /// Python and Rust processes share one count.
    #[test]
    fn the_python_client_takes_by_the_same_script() {
        crate::store::tests::assert_python_runs("TAKE", super::TAKE);
    }
}
