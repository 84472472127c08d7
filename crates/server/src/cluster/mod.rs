//! The cluster: this controller among others sharing one etcd. [`role`] is its role
//! (standalone, leader or follower, and who leads), [`leader_link`] the passing of calls to
//! the leader;
//! beside it, `election` (who leads) with `peer_watch` (a dead peer's lease ended at once)
//! and `etcd_hold` (a leader riding out an etcd outage on the grants it gave),
//! `shard_map` (the shard map on etcd) and
//! [`shard_routing`] (which controller owns which group) and [`shard_exchange`] (an exchange
//! split by the owners of its groups and answered by them), [`regions`] (the region
//! tier's lease on the global one) and `upstream_lease` (a regional leader's loop that
//! takes it), with [`upstream_settings`] (a region's groups copied from the global tier). It calls the controller and the store; the front ends call it.

#[cfg(feature = "etcd")]
pub(crate) mod election;
#[cfg(feature = "etcd")]
pub(crate) mod etcd_hold;
pub mod leader_link;
#[cfg(feature = "etcd")]
pub(crate) mod peer_watch;
pub mod regions;
pub mod role;
pub mod shard_exchange;
#[cfg(feature = "etcd")]
pub(crate) mod shard_map;
pub mod shard_routing;
pub(crate) mod upstream_lease;
pub mod upstream_settings;
