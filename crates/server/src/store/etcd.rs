//! Settings in etcd (TiDB's resource manager keeps its groups there): every controller started
//! on the same endpoints and prefix reads and writes one set of settings, and sees the others'
//! changes through a watch.
//!
//! Keys, under the prefix (`/tollgate` by default):
//!
//! | key | value |
//! | --- | --- |
//! | `format` | `tollgate-settings-v1`: what marks the prefix as Tollgate's |
//! | `groups/NAME` | the group's settings, the contract's `GroupSettings` encoded with prost |
//! | `node` | the node settings, the contract's `NodeInfo` |
//! | `meters/NAME` | the group's consumption, 32 bytes as in the file store |
//! | `ramps/NAME` | a resumable ramp, 16 bytes as in the file store |
//! | `rls_rules` | the RLS mapping rules as JSON |
//! | `credentials/ID` | a credential as JSON: its role, groups, expiry and the token's hash |
//! | `audit/KEY` | one audit record as JSON, KEY its time and sequence |
//! | `usage/MINUTE/NAME` | the group's meter as of that minute (Unix ms, 13 digits), 32 bytes |
//!
//! A write returns once etcd has committed it (a quorum of its members). etcd's client is
//! asynchronous and the store's trait is not: the store runs its client on a thread of its own,
//! so it can be called from anywhere, a runtime's worker included, and every call is bounded by
//! [`ETCD_TIMEOUT`].

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use prost::Message;
use tollgate_model::engine::Meter;
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_proto::v1;

use super::file::{decode_meter, decode_ramp, encode_meter, encode_ramp};
use super::{AuditRecord, SettingsStore, StoreError, Stored, StoredNode, StoredRamp};
use crate::convert;
pub use crate::store::target::EtcdTarget;

/// How long one call to etcd may take, connecting included.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(5);
/// The value of the `format` key.
pub const FORMAT: &str = "tollgate-settings-v1";
/// etcd's default limit on operations in one transaction.
const TXN_OPS_MAX: usize = 128;

/// One change seen in etcd, made by any controller.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredChange {
    /// A group's settings were written (`Some`) or removed (`None`).
    Group(GroupName, Option<Box<GroupSettings>>),
    /// The node settings were written.
    Node(StoredNode),
    /// A credential was written (`Some`, its JSON) or revoked (`None`).
    Credential(String, Option<String>),
    /// The RLS mapping rules were written (JSON).
    RlsRules(String),
}

type Job = Box<
    dyn FnOnce(&mut Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> + Send,
>;

/// The store. See the [module documentation](self).
pub struct EtcdStore {
    target: EtcdTarget,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    /// The revision of the last load: a watch starts after it.
    revision: i64,
    /// The audit record of the next settings write.
    staged: Option<AuditRecord>,
}

fn etcd_error(target: &EtcdTarget, e: impl std::fmt::Display) -> StoreError {
    StoreError::Etcd { target: target.describe(), reason: e.to_string() }
}

/// An etcd client error in a line: gRPC's message and the deepest cause (such as "Connection
/// refused"), rather than the whole nested debug form.
pub(crate) fn reason(e: &etcd_client::Error) -> String {
    let head = match e {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => other.to_string(),
    };
    let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut deepest = None;
    while let Some(c) = cause {
        deepest = Some(c.to_string());
        cause = c.source();
    }
    match deepest {
        Some(d) if !head.contains(&d) => format!("{head}: {d}"),
        _ => head,
    }
}

/// The most stored meters, and the most stored ramps, read at once by a controller taking
/// groups over.
const PROGRESS_READ_MAX: i64 = 1_000_000;

/// What a controller taking groups over (a new leader, or the new owner of a shard) reads so
/// that it carries on from what the last writer wrote: every group's consumption and every
/// resumable ramp, as stored.
pub(crate) struct StoredProgress {
    /// Each group's consumption.
    pub meters: Vec<(GroupName, Meter)>,
    /// Each resumable ramp.
    pub ramps: Vec<(GroupName, StoredRamp)>,
    /// The groups with usage records of the last lease and a minute (see
    /// [`recent_since`](super::recent_since)): those whose clients may hold grants the last
    /// writer gave. `None` when they were not read.
    pub recent: Option<Vec<GroupName>>,
}

/// Reads the [`StoredProgress`]; `None`, logged, when etcd does not answer within
/// [`ETCD_TIMEOUT`]. A malformed entry is left out.
pub(crate) async fn stored_progress(
    client: &mut Client,
    target: &EtcdTarget,
    since_unix_ms: u64,
) -> Option<StoredProgress> {
    let meters = read_prefix(client, target, "meters/", |v| decode_meter(v).ok()).await?;
    let ramps = read_prefix(client, target, "ramps/", |v| decode_ramp(v).ok()).await?;
    let recent = recent_usage(client, target, since_unix_ms).await;
    Some(StoredProgress { meters, ramps, recent })
}

/// The groups with a usage record of a minute at or after `since_unix_ms`; `None`, logged,
/// when etcd does not answer.
async fn recent_usage(
    client: &mut Client,
    target: &EtcdTarget,
    since_unix_ms: u64,
) -> Option<Vec<GroupName>> {
    let prefix = target.key("usage/");
    let options =
        GetOptions::new().with_range(format!("{prefix}~")).with_keys_only().with_limit(PROGRESS_READ_MAX);
    let from = format!("{prefix}{since_unix_ms:013}");
    match tokio::time::timeout(ETCD_TIMEOUT, client.get(from, Some(options))).await {
        Ok(Ok(got)) => {
            let names = got.kvs().iter().filter_map(|kv| {
                let key = std::str::from_utf8(kv.key().strip_prefix(prefix.as_bytes())?).ok()?;
                GroupName::new(key.split_once('/')?.1).ok()
            });
            Some(super::distinct(names, usize::MAX))
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %reason(&e), "the groups with traffic lately were not read; every group is learnt");
            None
        }
        Err(_) => {
            tracing::warn!(
                "the groups with traffic lately were not read within {ETCD_TIMEOUT:?}; every group is learnt"
            );
            None
        }
    }
}

/// Each group's entry under `PREFIX/what`, decoded; `None`, logged, when etcd does not answer.
async fn read_prefix<T>(
    client: &mut Client,
    target: &EtcdTarget,
    what: &str,
    decode: impl Fn(&[u8]) -> Option<T>,
) -> Option<Vec<(GroupName, T)>> {
    let prefix = target.key(what);
    let options = GetOptions::new().with_prefix().with_limit(PROGRESS_READ_MAX);
    let got = match tokio::time::timeout(ETCD_TIMEOUT, client.get(prefix.clone(), Some(options))).await {
        Ok(Ok(got)) => got,
        Ok(Err(e)) => {
            tracing::warn!(error = %reason(&e), what, "what was stored was not read; counting on from this controller's");
            return None;
        }
        Err(_) => {
            tracing::warn!(
                what,
                "what was stored was not read within {ETCD_TIMEOUT:?}; counting on from this controller's"
            );
            return None;
        }
    };
    Some(
        got.kvs()
            .iter()
            .filter_map(|kv| {
                let name = std::str::from_utf8(kv.key().strip_prefix(prefix.as_bytes())?).ok()?;
                Some((GroupName::new(name).ok()?, decode(kv.value())?))
            })
            .collect(),
    )
}

/// A client whose every call is bounded by [`ETCD_TIMEOUT`].
pub(crate) async fn connect(target: &EtcdTarget) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new().with_connect_timeout(ETCD_TIMEOUT).with_timeout(ETCD_TIMEOUT);
    Client::connect(&target.endpoints, Some(options)).await
}

/// A client whose calls are not bounded (its connection is): for a campaign, which waits as
/// long as another controller leads. Its caller bounds the calls that should answer at once.
pub(crate) async fn connect_unbounded(target: &EtcdTarget) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new().with_connect_timeout(ETCD_TIMEOUT);
    Client::connect(&target.endpoints, Some(options)).await
}

impl EtcdStore {
    /// The puts of `meters` and of each as its group's usage record for the minute starting at
    /// `minute_unix_ms`.
    fn meter_puts(&self, meters: &[(GroupName, Meter)], minute_unix_ms: u64) -> Vec<TxnOp> {
        let put = |key: String, m: &Meter| TxnOp::put(self.target.key(&key), encode_meter(m).to_vec(), None);
        let mut ops: Vec<TxnOp> = meters.iter().map(|(n, m)| put(format!("meters/{n}"), m)).collect();
        ops.extend(meters.iter().map(|(n, m)| put(format!("usage/{minute_unix_ms:013}/{n}"), m)));
        ops
    }

    /// Meters, their usage records and the ramps in one transaction; of the stored ramps,
    /// those of `scope` (every group's when `None`) that are not given go.
    fn write_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        ramps: &[(GroupName, StoredRamp)],
        minute_unix_ms: u64,
        scope: Option<&std::collections::HashSet<GroupName>>,
    ) -> Result<(), StoreError> {
        let mut ops = self.meter_puts(meters, minute_unix_ms);
        // The ramps are replaced: those no longer resumable go.
        let kept: BTreeMap<&GroupName, &StoredRamp> = ramps.iter().map(|(n, r)| (n, r)).collect();
        let old_ramps = {
            let all = self.target.key("ramps/");
            self.call(move |c| {
                Box::pin(async move {
                    let r = c.get(all, Some(GetOptions::new().with_prefix().with_keys_only())).await?;
                    Ok(r.kvs().iter().map(|kv| kv.key().to_vec()).collect::<Vec<_>>())
                })
            })?
        };
        let ramp_prefix = self.target.key("ramps/");
        for k in old_ramps {
            let name = String::from_utf8_lossy(&k[ramp_prefix.len()..]).into_owned();
            let answers_for = scope.is_none_or(|s| GroupName::new(&name).is_ok_and(|n| s.contains(&n)));
            if answers_for && !kept.keys().any(|n| n.as_str() == name) {
                ops.push(TxnOp::delete(k, None));
            }
        }
        for (n, r) in ramps {
            ops.push(TxnOp::put(self.target.key(&format!("ramps/{n}")), encode_ramp(r).to_vec(), None));
        }
        self.put_txn(ops)?;
        // Past the bound, the oldest minutes go.
        let prefix = self.target.key("usage/");
        self.call(move |c| Box::pin(trim_oldest(c, prefix, super::USAGE_MAX)))
    }

    /// Connects (within [`ETCD_TIMEOUT`]) and checks that the prefix is Tollgate's or empty;
    /// an empty prefix is marked as Tollgate's.
    pub fn connect(target: EtcdTarget) -> Result<EtcdStore, StoreError> {
        let (jobs, mut queue) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let (ready, connected) = std_mpsc::sync_channel(1);
        let t = target.clone();
        std::thread::Builder::new()
            .name("tollgate-etcd".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready.send(Err(e.to_string()));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut client = match tokio::time::timeout(ETCD_TIMEOUT, connect(&t)).await {
                        Ok(Ok(c)) => c,
                        Ok(Err(e)) => {
                            let _ = ready.send(Err(reason(&e)));
                            return;
                        }
                        Err(_) => {
                            let _ = ready.send(Err(format!("no answer within {ETCD_TIMEOUT:?}")));
                            return;
                        }
                    };
                    let _ = ready.send(Ok(()));
                    while let Some(job) = queue.recv().await {
                        job(&mut client).await;
                    }
                });
            })
            .map_err(|e| etcd_error(&target, e))?;
        match connected.recv() {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => return Err(etcd_error(&target, format!("cannot connect: {reason}"))),
            Err(_) => return Err(etcd_error(&target, "cannot connect")),
        }
        let store = EtcdStore { target, jobs, revision: 0, staged: None };
        store.claim_prefix()?;
        Ok(store)
    }

    /// Runs `f` on the client's thread and waits for its answer (bounded).
    fn call<T: Send + 'static>(
        &self,
        f: impl for<'c> FnOnce(
            &'c mut Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<T, etcd_client::Error>> + Send + 'c>,
        > + Send
        + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = std_mpsc::sync_channel(1);
        let job: Job = Box::new(move |client| {
            Box::pin(async move {
                let r = tokio::time::timeout(ETCD_TIMEOUT, f(client)).await;
                let _ = tx.send(r);
            })
        });
        self.jobs.send(job).map_err(|_| etcd_error(&self.target, "the client's thread has stopped"))?;
        match rx.recv_timeout(ETCD_TIMEOUT + Duration::from_secs(1)) {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(etcd_error(&self.target, reason(&e))),
            Ok(Err(_)) | Err(_) => {
                Err(etcd_error(&self.target, format!("no answer within {ETCD_TIMEOUT:?}")))
            }
        }
    }

    /// Marks an empty prefix as Tollgate's; refuses one that holds something else.
    ///
    /// The format key and whether anything else is there are read in one transaction, so at
    /// one revision: a controller marks the prefix before it writes anything else there, so
    /// controllers started together on an empty prefix never see another's first writes
    /// without its mark (two reads could, between them).
    fn claim_prefix(&self) -> Result<(), StoreError> {
        let format_key = self.target.key("format");
        let all = format!("{}/", self.target.prefix);
        let (format, others) = self
            .call(move |c| {
                Box::pin(async move {
                    let keys_only = GetOptions::new().with_prefix().with_keys_only().with_limit(1);
                    let read = Txn::new()
                        .and_then([TxnOp::get(format_key.clone(), None), TxnOp::get(all, Some(keys_only))]);
                    let answer = c.txn(read).await?;
                    let mut gets = answer.op_responses().into_iter().filter_map(|op| match op {
                        TxnOpResponse::Get(g) => Some(g),
                        _ => None,
                    });
                    let format = gets.next().and_then(|f| f.kvs().first().map(|kv| kv.value().to_vec()));
                    Ok((format, gets.next().map_or(0, |any| any.count())))
                })
            })
            .map_err(|e| match e {
                // The client connects lazily: the first call is where an unreachable etcd shows.
                StoreError::Etcd { target, reason } => {
                    StoreError::Etcd { target, reason: format!("cannot connect: {reason}") }
                }
                other => other,
            })?;
        match format {
            Some(v) if v == FORMAT.as_bytes() => Ok(()),
            Some(v) => Err(etcd_error(
                &self.target,
                format!(
                    "the prefix holds data of another kind (format {:?}, expected {FORMAT:?}); choose another --etcd-prefix",
                    String::from_utf8_lossy(&v)
                ),
            )),
            None if others > 0 => Err(etcd_error(
                &self.target,
                "the prefix holds keys that are not Tollgate's (no format key); choose another --etcd-prefix",
            )),
            None => {
                let key = self.target.key("format");
                self.call(move |c| {
                    Box::pin(async move {
                        // Only if nobody marked it meanwhile.
                        let txn = Txn::new()
                            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(key, FORMAT, None)]);
                        c.txn(txn).await.map(drop)
                    })
                })
            }
        }
    }

    /// Where the settings are.
    pub fn target(&self) -> &EtcdTarget {
        &self.target
    }

    /// The revision the last [`load`](SettingsStore::load) read at.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Reads the usage records from key `from` to `end` (left out), a page at a time in minute
    /// order, handing each to `read` as its minute, its group's name and its value; a record
    /// whose key or value does not read is named as corrupt.
    fn read_usage(
        &self,
        from: String,
        end: String,
        mut read: impl FnMut(u64, &str, &[u8]) -> Result<(), String>,
    ) -> Result<(), StoreError> {
        const PAGE: i64 = 5000;
        let prefix = self.target.key("usage/");
        let mut from = from;
        loop {
            let (start, stop) = (from.clone(), end.clone());
            let page = self.call(move |c| {
                Box::pin(async move {
                    let r = c.get(start, Some(GetOptions::new().with_range(stop).with_limit(PAGE))).await?;
                    Ok(r.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect::<Vec<_>>())
                })
            })?;
            let full = page.len() as i64 == PAGE;
            for (k, v) in &page {
                let key = String::from_utf8_lossy(k);
                let Some((minute, name)) = key[prefix.len()..].split_once('/') else { continue };
                let corrupt = |reason: String| StoreError::Etcd {
                    target: self.target.describe(),
                    reason: format!("stored usage record {key:?} is corrupt: {reason}"),
                };
                let minute_unix_ms =
                    minute.parse().map_err(|e: std::num::ParseIntError| corrupt(e.to_string()))?;
                read(minute_unix_ms, name, v).map_err(corrupt)?;
            }
            match page.last() {
                Some((k, _)) if full => from = format!("{}\0", String::from_utf8_lossy(k)),
                _ => return Ok(()),
            }
        }
    }

    fn put_txn(&self, ops: Vec<TxnOp>) -> Result<(), StoreError> {
        for chunk in ops.chunks(TXN_OPS_MAX) {
            let chunk = chunk.to_vec();
            self.call(move |c| Box::pin(async move { c.txn(Txn::new().and_then(chunk)).await.map(drop) }))?;
        }
        Ok(())
    }
}

/// Deletes the first keys under `prefix` (the oldest, as the keys sort by time) past `max`.
async fn trim_oldest(c: &mut Client, prefix: String, max: usize) -> Result<(), etcd_client::Error> {
    let count = c.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_count_only())).await?.count();
    let excess = count.saturating_sub(i64::try_from(max).unwrap_or(i64::MAX));
    if excess > 0 {
        let oldest =
            c.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only().with_limit(excess))).await?;
        for kv in oldest.kvs() {
            c.delete(kv.key().to_vec(), None).await?;
        }
    }
    Ok(())
}

/// What a key under the prefix is.
fn parse_change(prefix: &str, key: &[u8], value: Option<&[u8]>) -> Result<Option<StoredChange>, String> {
    let key = String::from_utf8_lossy(key);
    let Some(rest) = key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) else { return Ok(None) };
    if let Some(name) = rest.strip_prefix("groups/") {
        let name = GroupName::new(name).map_err(|e| format!("group key {key:?}: {}", e.rule))?;
        let settings = match value {
            Some(v) => Some(Box::new(decode_group(v).map_err(|e| format!("group {name}: {e}"))?)),
            None => None,
        };
        return Ok(Some(StoredChange::Group(name, settings)));
    }
    if let Some(id) = rest.strip_prefix("credentials/") {
        let record = match value {
            Some(v) => Some(String::from_utf8(v.to_vec()).map_err(|e| format!("credential {id}: {e}"))?),
            None => None,
        };
        return Ok(Some(StoredChange::Credential(id.to_string(), record)));
    }
    if rest == "rls_rules"
        && let Some(v) = value
    {
        let text = String::from_utf8(v.to_vec()).map_err(|e| format!("RLS rules: {e}"))?;
        return Ok(Some(StoredChange::RlsRules(text)));
    }
    if rest == "node"
        && let Some(v) = value
    {
        let msg = v1::NodeInfo::decode(v).map_err(|e| format!("node settings: {e}"))?;
        return Ok(Some(StoredChange::Node(StoredNode::from_proto(&msg))));
    }
    Ok(None)
}

fn decode_group(v: &[u8]) -> Result<GroupSettings, String> {
    let msg = v1::GroupSettings::decode(v).map_err(|e| e.to_string())?;
    convert::settings_from_proto(&msg).map_err(|e| e.to_string())
}

/// The key the next audit record takes under `prefix`: after the newest, whoever wrote it.
async fn next_audit_key(c: &mut Client, prefix: &str, at_unix_ms: u64) -> Result<String, etcd_client::Error> {
    let newest = c
        .get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_sort(etcd_client::SortTarget::Key, etcd_client::SortOrder::Descend)
                    .with_limit(1),
            ),
        )
        .await?;
    let last =
        newest.kvs().first().and_then(|kv| std::str::from_utf8(&kv.key()[prefix.len()..]).ok()?.parse().ok());
    Ok(format!("{prefix}{:020}", super::audit_key(at_unix_ms, last)))
}

impl EtcdStore {
    /// Runs `ops` in one transaction with the staged audit record, if any; with `existing`,
    /// only if that key exists (the answer says whether it did).
    fn change(&mut self, mut ops: Vec<TxnOp>, existing: Option<String>) -> Result<bool, StoreError> {
        let staged = self.staged.take();
        let prefix = self.target.key("audit/");
        self.call(move |c| {
            Box::pin(async move {
                if let Some(record) = &staged {
                    let key = next_audit_key(c, &prefix, record.at_unix_ms).await?;
                    ops.push(TxnOp::put(key, record.to_json(), None));
                }
                let mut txn = Txn::new();
                if let Some(key) = existing {
                    txn = txn.when([Compare::create_revision(key, CompareOp::Greater, 0)]);
                }
                let done = c.txn(txn.and_then(ops)).await?.succeeded();
                if staged.is_some() {
                    // Past the bound, the oldest go.
                    trim_oldest(c, prefix, super::AUDIT_MAX).await?;
                }
                Ok(done)
            })
        })
    }
}

impl SettingsStore for EtcdStore {
    fn load(&mut self) -> Result<Stored, StoreError> {
        // Everything but the logs: keys sort `audit/` < `credentials/` < … < `rls_rules` <
        // `usage/`, so one range from `b` up to `usage/` leaves out the audit and usage
        // records (up to 100,000 and 1,000,000 keys), which are read only when asked for.
        let from = format!("{}/b", self.target.prefix);
        let to = format!("{}/usage/", self.target.prefix);
        let (revision, kvs) = self.call(move |c| {
            Box::pin(async move {
                let r = c.get(from, Some(GetOptions::new().with_range(to))).await?;
                let revision = r.header().map_or(0, |h| h.revision());
                Ok((
                    revision,
                    r.kvs().iter().map(|kv| (kv.key().to_vec(), kv.value().to_vec())).collect::<Vec<_>>(),
                ))
            })
        })?;
        let mut out = Stored::default();
        let corrupt = |what: String, reason: String| StoreError::Etcd {
            target: self.target.describe(),
            reason: format!("stored {what} is corrupt: {reason}"),
        };
        for (k, v) in kvs {
            let key = String::from_utf8_lossy(&k).into_owned();
            let rest = &key[self.target.prefix.len() + 1..];
            let named = |r: &str| GroupName::new(r).map_err(|e| corrupt(format!("key {key:?}"), e.rule));
            if let Some(name) = rest.strip_prefix("groups/") {
                let settings = decode_group(&v).map_err(|e| corrupt(format!("group {name}"), e))?;
                out.groups.insert(named(name)?, settings);
            } else if let Some(name) = rest.strip_prefix("meters/") {
                out.meters
                    .insert(named(name)?, decode_meter(&v).map_err(|e| corrupt(format!("meter {name}"), e))?);
            } else if let Some(name) = rest.strip_prefix("ramps/") {
                out.ramps
                    .insert(named(name)?, decode_ramp(&v).map_err(|e| corrupt(format!("ramp {name}"), e))?);
            } else if let Some(id) = rest.strip_prefix("credentials/") {
                let text =
                    String::from_utf8(v).map_err(|e| corrupt(format!("credential {id}"), e.to_string()))?;
                out.credentials.insert(id.to_string(), text);
            } else if rest == "rls_rules" {
                out.rls_rules =
                    Some(String::from_utf8(v).map_err(|e| corrupt("RLS rules".into(), e.to_string()))?);
            } else if rest == "node" {
                let msg = v1::NodeInfo::decode(v.as_slice())
                    .map_err(|e| corrupt("node settings".into(), e.to_string()))?;
                out.node = StoredNode::from_proto(&msg);
                out.node_stored = true;
            }
        }
        self.revision = revision;
        Ok(out)
    }

    fn put_group(&mut self, name: &GroupName, settings: &GroupSettings) -> Result<(), StoreError> {
        let key = self.target.key(&format!("groups/{name}"));
        let value = convert::settings_to_proto(settings).encode_to_vec();
        self.change(vec![TxnOp::put(key, value, None)], None).map(drop)
    }

    fn drop_group(&mut self, name: &GroupName) -> Result<bool, StoreError> {
        let group = self.target.key(&format!("groups/{name}"));
        let meter = self.target.key(&format!("meters/{name}"));
        // The group and its meter go together; the answer says whether the group was there.
        self.change(vec![TxnOp::delete(group.clone(), None), TxnOp::delete(meter, None)], Some(group))
    }

    fn put_credential(&mut self, id: &str, record: &str) -> Result<(), StoreError> {
        let key = self.target.key(&format!("credentials/{id}"));
        self.change(vec![TxnOp::put(key, record.to_string(), None)], None).map(drop)
    }

    fn drop_credential(&mut self, id: &str) -> Result<bool, StoreError> {
        let key = self.target.key(&format!("credentials/{id}"));
        self.change(vec![TxnOp::delete(key.clone(), None)], Some(key))
    }

    fn set_rls_rules(&mut self, json: &str) -> Result<(), StoreError> {
        let key = self.target.key("rls_rules");
        self.change(vec![TxnOp::put(key, json.to_string(), None)], None).map(drop)
    }

    fn set_node(&mut self, node: StoredNode) -> Result<(), StoreError> {
        let key = self.target.key("node");
        self.change(vec![TxnOp::put(key, node.to_proto().encode_to_vec(), None)], None).map(drop)
    }

    fn audited(&mut self, record: AuditRecord) -> &mut dyn SettingsStore {
        self.staged = Some(record);
        self
    }

    fn put_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        ramps: &[(GroupName, StoredRamp)],
        minute_unix_ms: u64,
    ) -> Result<(), StoreError> {
        self.write_meters(meters, ramps, minute_unix_ms, None)
    }

    fn put_meters_of(
        &mut self,
        meters: &[(GroupName, Meter)],
        ramps: &[(GroupName, StoredRamp)],
        minute_unix_ms: u64,
        scope: &std::collections::HashSet<GroupName>,
    ) -> Result<(), StoreError> {
        self.write_meters(meters, ramps, minute_unix_ms, Some(scope))
    }

    fn put_running_meters(
        &mut self,
        meters: &[(GroupName, Meter)],
        minute_unix_ms: u64,
    ) -> Result<(), StoreError> {
        if meters.is_empty() {
            return Ok(());
        }
        // Written within the minute again and again: the records' bound is kept at the flushes.
        self.put_txn(self.meter_puts(meters, minute_unix_ms))
    }

    fn consumed_before(&mut self, windows: &[(GroupName, u64)]) -> Result<Vec<Option<f64>>, StoreError> {
        let Some(last) = windows.iter().map(|(_, start)| *start).max() else { return Ok(Vec::new()) };
        // The records sort by minute: one read of those before the latest start.
        let (prefix, end) = (self.target.key("usage/"), self.target.key(&format!("usage/{last:013}")));
        let mut found: Vec<Option<f64>> = vec![None; windows.len()];
        let mut wanted: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, (group, _)) in windows.iter().enumerate() {
            wanted.entry(group.as_str()).or_default().push(i);
        }
        self.read_usage(prefix.clone(), end, |minute_unix_ms, name, value| {
            let Some(at) = wanted.get(name) else { return Ok(()) };
            let consumed = decode_meter(value)?.consumed;
            for &i in at.iter().filter(|&&i| minute_unix_ms < windows[i].1) {
                found[i] = Some(consumed);
            }
            Ok(())
        })?;
        Ok(found)
    }

    fn put_usage(&mut self, meters: &[(GroupName, Meter)], minute_unix_ms: u64) -> Result<(), StoreError> {
        if meters.is_empty() {
            return Ok(());
        }
        let ops: Vec<TxnOp> = meters
            .iter()
            .map(|(n, m)| {
                TxnOp::put(
                    self.target.key(&format!("usage/{minute_unix_ms:013}/{n}")),
                    encode_meter(m).to_vec(),
                    None,
                )
            })
            .collect();
        self.put_txn(ops)?;
        let prefix = self.target.key("usage/");
        self.call(move |c| Box::pin(trim_oldest(c, prefix, super::USAGE_MAX)))
    }

    fn recent_groups(&mut self, since_unix_ms: u64, limit: usize) -> Result<Vec<GroupName>, StoreError> {
        let prefix = self.target.key("usage/");
        let (from, end) = (format!("{prefix}{since_unix_ms:013}"), format!("{prefix}~"));
        let cap = i64::try_from(limit.saturating_mul(4).min(super::USAGE_MAX)).unwrap_or(i64::MAX);
        let keys = self.call(move |c| {
            Box::pin(async move {
                let options = GetOptions::new().with_range(end).with_keys_only().with_limit(cap);
                let r = c.get(from, Some(options)).await?;
                Ok(r.kvs().iter().map(|kv| kv.key().to_vec()).collect::<Vec<_>>())
            })
        })?;
        let names = keys.iter().filter_map(|k| {
            let key = String::from_utf8_lossy(k);
            let (_, name) = key.get(prefix.len()..)?.split_once('/')?;
            GroupName::new(name).ok()
        });
        Ok(super::distinct(names, limit))
    }

    fn usage(
        &mut self,
        group: Option<&GroupName>,
        since_unix_ms: u64,
        limit: usize,
    ) -> Result<Vec<super::UsageRecord>, StoreError> {
        let prefix = self.target.key("usage/");
        let end = format!("{prefix}~");
        let mut pick = super::UsageSelector::new(group, since_unix_ms, limit);
        self.read_usage(prefix, end, |minute_unix_ms, name, value| {
            if pick.wants(name) {
                let group = GroupName::new(name).map_err(|e| e.rule)?;
                pick.push(super::UsageRecord { minute_unix_ms, group, meter: decode_meter(value)? });
            }
            Ok(())
        })?;
        Ok(pick.finish())
    }

    fn append_audit(&mut self, record: &AuditRecord) -> Result<(), StoreError> {
        self.staged = Some(record.clone());
        self.change(Vec::new(), None).map(drop)
    }

    fn audit(&mut self, since_unix_ms: u64, limit: usize) -> Result<Vec<AuditRecord>, StoreError> {
        let prefix = self.target.key("audit/");
        let from = format!("{prefix}{:020}", super::audit_key(since_unix_ms, None));
        let end = format!("{prefix}~");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let values = self.call(move |c| {
            Box::pin(async move {
                let r = c.get(from, Some(GetOptions::new().with_range(end).with_limit(limit))).await?;
                Ok(r.kvs().iter().map(|kv| kv.value().to_vec()).collect::<Vec<_>>())
            })
        })?;
        values
            .iter()
            .map(|v| {
                AuditRecord::from_json(&String::from_utf8_lossy(v)).map_err(|e| StoreError::Etcd {
                    target: self.target.describe(),
                    reason: format!("stored audit record is corrupt: {e}"),
                })
            })
            .collect()
    }
}

/// Follows every change to the settings under the target's prefix from `after` (a revision)
/// on, and hands each to `apply`, until the watch breaks: then returns, with the revision
/// reached, so the caller can load again and watch anew.
pub async fn watch(
    target: &EtcdTarget,
    after: i64,
    mut apply: impl FnMut(StoredChange),
) -> (i64, Result<(), String>) {
    let mut reached = after;
    let mut client = match connect(target).await {
        Ok(c) => c,
        Err(e) => return (reached, Err(e.to_string())),
    };
    let options = WatchOptions::new().with_prefix().with_start_revision(after + 1);
    let mut stream = match client.watch(format!("{}/", target.prefix), Some(options)).await {
        Ok(s) => s,
        Err(e) => return (reached, Err(e.to_string())),
    };
    loop {
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() {
                    return (reached, Err(format!("watch cancelled: {}", resp.cancel_reason())));
                }
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    reached = reached.max(kv.mod_revision());
                    let value = (event.event_type() == EventType::Put).then(|| kv.value());
                    match parse_change(&target.prefix, kv.key(), value) {
                        Ok(Some(change)) => apply(change),
                        Ok(None) => {}
                        Err(e) => tracing::warn!(error = %e, "etcd: a change left out"),
                    }
                }
            }
            Ok(None) => return (reached, Err("the watch ended".into())),
            Err(e) => return (reached, Err(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_what_changed() {
        let g = convert::settings_to_proto(&GroupSettings::fixed(5.0).unwrap()).encode_to_vec();
        assert_eq!(
            parse_change("/p", b"/p/groups/a", Some(&g)).unwrap(),
            Some(StoredChange::Group(
                GroupName::new("a").unwrap(),
                Some(Box::new(GroupSettings::fixed(5.0).unwrap()))
            ))
        );
        assert_eq!(
            parse_change("/p", b"/p/groups/a", None).unwrap(),
            Some(StoredChange::Group(GroupName::new("a").unwrap(), None))
        );
        assert_eq!(parse_change("/p", b"/p/meters/a", Some(b"x")).unwrap(), None);
        assert!(parse_change("/p", b"/p/groups/a", Some(b"\xff\xff")).is_err());
    }
}
