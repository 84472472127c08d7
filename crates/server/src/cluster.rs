//! This controller's part among controllers sharing one etcd: standalone, leader or follower,
//! and who leads. The election (with etcd) sets the role; the front ends
//! read it to send work meant for the leader there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tollgate_model::time::Nanos;
use tonic::Status;

use crate::controller::Controller;

/// A controller's part among controllers sharing one etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No election: the only controller.
    Standalone,
    /// Elected: grants, takes reports, writes consumption.
    Leader,
    /// Another controller leads (or none does yet): clients and backends are sent there.
    Follower,
}

impl Role {
    /// As `/status` says it.
    pub fn name(self) -> &'static str {
        match self {
            Role::Standalone => "standalone",
            Role::Leader => "leader",
            Role::Follower => "follower",
        }
    }
}

/// The role and the leader's advertised address, when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleView {
    /// This controller's part.
    pub role: Role,
    /// The leader's advertised gRPC URL (this controller's own when it leads).
    pub leader: Option<String>,
}

/// The gRPC metadata key a follower names the leader in.
pub const LEADER_METADATA: &str = "tollgate-leader";

/// This controller's role, and the controller it hands leadership to. See the
/// [module documentation](self).
pub struct Cluster {
    controller: Arc<Controller>,
    role: Mutex<RoleView>,
    /// Times this controller became the leader.
    leader_changes: AtomicU64,
}

impl Cluster {
    /// A standalone controller's part (until an election says otherwise).
    pub fn new(controller: Arc<Controller>) -> Cluster {
        Cluster {
            controller,
            role: Mutex::new(RoleView { role: Role::Standalone, leader: None }),
            leader_changes: AtomicU64::new(0),
        }
    }

    /// This controller's role now.
    pub fn role(&self) -> RoleView {
        self.role.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Times this controller has become the leader.
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes.load(Ordering::Relaxed)
    }

    /// Takes a role from the election. Becoming the leader starts a learning lease at `now`
    /// ([`Controller::relearn`]): clients' grants from the last leader are renewed as they
    /// report them, and first-time clients get only what is left under each target.
    pub fn set_role(&self, now: Nanos, view: RoleView) {
        let mut role = self.role.lock().unwrap_or_else(PoisonError::into_inner);
        if view.role == Role::Leader && role.role != Role::Leader {
            self.controller.relearn(now);
            self.leader_changes.fetch_add(1, Ordering::Relaxed);
        }
        *role = view;
    }

    /// Refuses work meant for the leader while this controller follows: `UNAVAILABLE`, with
    /// the leader's address in the message and in the `tollgate-leader` metadata.
    pub fn check_leader(&self) -> Result<(), Status> {
        let role = self.role();
        if role.role != Role::Follower {
            return Ok(());
        }
        let mut status = match &role.leader {
            Some(l) => Status::unavailable(format!("not the leader; the leader is {l}")),
            None => Status::unavailable("not the leader, and no leader is elected yet"),
        };
        if let Some(value) = role.leader.and_then(|l| l.parse().ok()) {
            status.metadata_mut().insert(LEADER_METADATA, value);
        }
        Err(status)
    }
}
