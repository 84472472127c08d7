//! A dead peer's lease ended at once. Each controller holds its member key, its candidacy and
//! (sharded) its claim on shards under one etcd lease, which etcd ends only a lease after the
//! last renewal: on a stock etcd no lease is shorter than 2 s, so a killed leader or shard
//! owner would hold the election and its shards that long.
//!
//! A process that died leaves its port closed: a connection to it is refused at once, where a
//! controller that is alive accepts it, and one on a host that is down or cut off times out.
//! So each controller connects to every other member's advertised address every
//! [`PROBE`]; a peer that refuses [`STRIKES`] connections in a row is dead, and this
//! controller revokes its lease. Its member key and candidacy go with the lease, so the next
//! candidate is elected and its shards are handed on at once. A timeout is no evidence (a
//! slow or partitioned peer may still be serving): that peer's lease runs out as before.
//!
//! The probes are TCP connections between controllers, no etcd traffic; the member list is
//! read from etcd once every [`REFRESH`], and a revocation is one call per death.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Client, GetOptions};

use crate::store::etcd::{ETCD_TIMEOUT, connect, reason};

/// How often each peer is probed.
pub const PROBE: Duration = Duration::from_millis(100);
/// Refused connections in a row that make a peer dead.
pub const STRIKES: u32 = 2;
/// How often the member list is read again.
pub const REFRESH: Duration = Duration::from_secs(1);
/// How long a probe's connection may take: longer is no evidence either way.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// The most members probed (the rest are left to their leases).
const PEERS_MAX: usize = 64;

/// The answer to a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The peer accepted the connection: alive.
    Accepted,
    /// Nothing listens at its address: the process is gone.
    Refused,
    /// No answer, or another failure: no evidence.
    Unknown,
}

/// Connects to `address` (`host:port`) once.
pub async fn probe(address: &str) -> Probe {
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Ok(_)) => Probe::Accepted,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refused,
        _ => Probe::Unknown,
    }
}

/// The `host:port` of an advertised URL (`http://host:port`, `https://host:port/`).
pub fn host_port(advertised: &str) -> Option<&str> {
    let rest = advertised.split_once("://").map_or(advertised, |(_, r)| r);
    let at = rest.split('/').next()?;
    (!at.is_empty() && at.contains(':')).then_some(at)
}

/// Each peer's refused probes in a row, by member key.
#[derive(Debug, Default)]
pub struct Strikes(HashMap<String, u32>);

impl Strikes {
    /// Counts a probe of the member `key`; `true` when it makes the peer dead (once: its
    /// count starts again).
    pub fn count(&mut self, key: &str, probe: Probe) -> bool {
        match probe {
            Probe::Refused => {
                let n = self.0.entry(key.to_string()).or_default();
                *n += 1;
                if *n >= STRIKES {
                    self.0.remove(key);
                    return true;
                }
                false
            }
            Probe::Accepted | Probe::Unknown => {
                self.0.remove(key);
                false
            }
        }
    }

    /// Forgets the peers no longer listed.
    pub fn keep_only(&mut self, listed: &[Member]) {
        self.0.retain(|k, _| listed.iter().any(|m| &m.key == k));
    }
}

/// Another controller as its member key says: the key, its advertised address and its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    key: String,
    /// Its advertised URL.
    url: String,
    address: String,
    lease: i64,
}

/// The members under `prefix` but `me`, with a lease and an address to probe.
async fn members(client: &mut Client, prefix: &str, me: &str) -> Result<Vec<Member>, String> {
    let listed =
        tokio::time::timeout(ETCD_TIMEOUT, client.get(prefix, Some(GetOptions::new().with_prefix())))
            .await
            .map_err(|_| format!("etcd did not answer within {ETCD_TIMEOUT:?}"))?
            .map_err(|e| reason(&e))?;
    Ok(listed
        .kvs()
        .iter()
        .filter_map(|kv| {
            let key = kv.key_str().ok()?;
            let url = kv.value_str().ok()?;
            let address = host_port(url)?;
            (key != me && kv.lease() != 0).then(|| Member {
                key: key.to_string(),
                url: url.to_string(),
                address: address.to_string(),
                lease: kv.lease(),
            })
        })
        .take(PEERS_MAX)
        .collect())
}

/// The other controllers' advertised URLs, as the member list last read from etcd gave them
/// (kept through an etcd outage: a leader holding its grants asks them who leads).
#[derive(Debug, Default)]
pub struct Peers(std::sync::Mutex<Vec<String>>);

impl Peers {
    /// The URLs last listed.
    pub fn urls(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set(&self, listed: &[Member]) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            listed.iter().map(|m| m.url.clone()).collect();
    }
}

/// Probes the other members under `prefix` (this controller's own key is `me`) for as long
/// as it runs, and revokes the lease of each one found dead; keeps `peers` listing them.
pub async fn watch(
    target: crate::options::EtcdTarget,
    prefix: String,
    me: String,
    peers: std::sync::Arc<Peers>,
) {
    let mut client = None;
    let mut listed: Vec<Member> = Vec::new();
    let mut strikes = Strikes::default();
    let mut probes = tokio::time::interval(PROBE);
    probes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut turn = 0u64;
    loop {
        probes.tick().await;
        let refresh = turn.is_multiple_of(REFRESH.as_millis() as u64 / PROBE.as_millis() as u64);
        turn += 1;
        if client.is_none() {
            client = connect(&target).await.ok();
        }
        let Some(c) = client.as_mut() else { continue };
        if refresh {
            match members(c, &prefix, &me).await {
                Ok(m) => {
                    listed = m;
                    peers.set(&listed);
                }
                Err(_) => client = None,
            }
            strikes.keep_only(&listed);
        }
        let answers = futures_util::future::join_all(listed.iter().map(|m| probe(&m.address))).await;
        let dead: Vec<Member> = listed
            .iter()
            .zip(answers)
            .filter(|(m, a)| strikes.count(&m.key, *a))
            .map(|(m, _)| m.clone())
            .collect();
        for m in &dead {
            let Some(c) = client.as_mut() else { break };
            match tokio::time::timeout(ETCD_TIMEOUT, c.lease_revoke(m.lease)).await {
                Ok(Ok(_)) => {
                    tracing::warn!(peer = %m.address, "a controller refuses connections: its lease revoked, so its election and shards move at once");
                }
                Ok(Err(e)) if reason(&e).contains("lease not found") => {}
                Ok(Err(e)) => {
                    tracing::debug!(peer = %m.address, error = %reason(&e), "cannot revoke a dead peer's lease")
                }
                Err(_) => {
                    tracing::debug!(peer = %m.address, "cannot revoke a dead peer's lease: etcd did not answer")
                }
            }
            listed.retain(|l| l.key != m.key);
            peers.set(&listed);
        }
    }
}

/// A task that ends when this guard is dropped.
#[derive(Debug)]
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertised_url_gives_its_host_and_port() {
        assert_eq!(host_port("http://127.0.0.1:7070"), Some("127.0.0.1:7070"));
        assert_eq!(host_port("https://tollgate-1.internal:7070/"), Some("tollgate-1.internal:7070"));
        assert_eq!(host_port("127.0.0.1:7070"), Some("127.0.0.1:7070"));
        assert_eq!(host_port("http://nohost"), None);
        assert_eq!(host_port("http://"), None);
    }

    #[test]
    fn a_peer_is_dead_after_refusals_in_a_row_and_only_then() {
        let mut s = Strikes::default();
        assert!(!s.count("a", Probe::Refused));
        assert!(!s.count("a", Probe::Unknown), "a timeout is no evidence, and starts the count again");
        assert!(!s.count("a", Probe::Refused));
        assert!(s.count("a", Probe::Refused), "two refusals in a row");
        assert!(!s.count("a", Probe::Refused), "counted afresh after");
        assert!(!s.count("b", Probe::Accepted));
    }

    #[tokio::test]
    async fn a_closed_port_refuses_and_a_listening_one_accepts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().to_string();
        assert_eq!(probe(&open).await, Probe::Accepted);
        drop(listener);
        assert_eq!(probe(&open).await, Probe::Refused);
    }
}
