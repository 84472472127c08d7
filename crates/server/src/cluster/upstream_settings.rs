//! A region with a store of its own (`--upstream`) takes its groups from the global tier: the
//! regional leader reads the global tier's groups every [`COPY_EVERY`] and makes its own store
//! hold the same, setting each group that differs and dropping each the global tier no longer
//! has, through the audited admin path (the region's followers follow its store as they follow
//! any change). Groups are set on the global tier: the region refuses a change of its own
//! ([`crate::controller::Admin::copy_groups_by`]). The region's node settings (capacity, mode) and its Envoy rules
//! stay its own. Cut off from the global tier, the region keeps the groups it last copied.

use std::collections::HashMap;
use std::time::Duration;

use tollgate_limiter::access::Rpc;
use tollgate_model::settings::{GroupName, GroupSettings};
use tollgate_model::time::Nanos;
use tollgate_proto::convert::{settings_from_proto, settings_to_proto};
use tollgate_proto::v1;
use tollgate_proto::v1::admin_client::AdminClient;

use crate::node::Node;

/// How often the regional leader copies the global tier's groups.
pub const COPY_EVERY: Duration = Duration::from_secs(2);

/// The groups read from the global tier per call.
const PAGE_SIZE: u32 = 1000;

/// The most groups copied; a global tier with more is refused whole (nothing changes).
pub const GROUPS_MAX: usize = 1_000_000;

/// Who the audit log says copied a group into region `region`'s store.
pub fn copier(region: &str) -> String {
    format!("region {region} copying the global tier")
}

/// What one copy changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Groups set (new, or their settings changed).
    pub set: usize,
    /// Groups dropped (the global tier no longer has them).
    pub dropped: usize,
    /// Changes the region's store refused (retried at the next copy).
    pub refused: usize,
}

/// The changes that make `local` hold what `global` holds: the groups to set, each parent
/// before its children, and the groups to drop, each child before its parent.
pub fn plan(
    local: &[(GroupName, GroupSettings)],
    global: &[(GroupName, GroupSettings)],
) -> (Vec<(GroupName, GroupSettings)>, Vec<GroupName>) {
    let here: HashMap<&GroupName, &GroupSettings> = local.iter().map(|(n, s)| (n, s)).collect();
    let there: HashMap<&GroupName, &GroupSettings> = global.iter().map(|(n, s)| (n, s)).collect();
    let mut sets: Vec<(GroupName, GroupSettings)> = global
        .iter()
        .filter(|(n, s)| here.get(n).is_none_or(|l| settings_to_proto(l) != settings_to_proto(s)))
        .cloned()
        .collect();
    sets.sort_by_key(|(n, _)| depth(n, &there));
    let mut drops: Vec<GroupName> =
        local.iter().filter(|(n, _)| !there.contains_key(n)).map(|(n, _)| n.clone()).collect();
    drops.sort_by_key(|n| std::cmp::Reverse(depth(n, &here)));
    (sets, drops)
}

/// How many parents above `name` in `groups` (bounded, so a loop cannot hang it).
fn depth(name: &GroupName, groups: &HashMap<&GroupName, &GroupSettings>) -> usize {
    let mut at = name;
    let mut n = 0;
    while let Some(parent) = groups.get(at).and_then(|s| s.parent()) {
        n += 1;
        if n > tollgate_model::hierarchy::DEPTH_MAX {
            break;
        }
        at = parent;
    }
    n
}

/// Reads every group of the global tier over `rpc`.
pub async fn read(rpc: Rpc, timeout: Duration) -> Result<Vec<(GroupName, GroupSettings)>, String> {
    let mut client = AdminClient::new(rpc);
    let mut groups = Vec::new();
    let mut page_token = String::new();
    loop {
        let ask = v1::ListGroupsRequest { page_size: PAGE_SIZE, page_token: page_token.clone() };
        let page = match tokio::time::timeout(timeout, client.list_groups(ask)).await {
            Ok(Ok(p)) => p.into_inner(),
            Ok(Err(status)) => {
                return Err(format!("reading the groups: {:?} {}", status.code(), status.message()));
            }
            Err(_) => return Err(format!("reading the groups: no answer within {timeout:?}")),
        };
        for info in page.groups {
            let name = GroupName::new(&info.name).map_err(|e| format!("group {:?}: {e}", info.name))?;
            let settings = settings_from_proto(&info.settings.unwrap_or_default())
                .map_err(|e| format!("group {name}: {e}"))?;
            groups.push((name, settings));
        }
        if groups.len() > GROUPS_MAX {
            return Err(format!("the global tier has more than {GROUPS_MAX} groups"));
        }
        if page.next_page_token.is_empty() {
            return Ok(groups);
        }
        page_token = page.next_page_token;
    }
}

/// Makes the region's store hold `global`'s groups, audited as done by `who`.
pub async fn apply(node: &Node, global: Vec<(GroupName, GroupSettings)>, who: String) -> Copied {
    let node = node.clone();
    let work = move || {
        let admin = node.controller.admin();
        let (sets, drops) = plan(&admin.groups(), &global);
        let mut copied = Copied::default();
        let wall_ms = crate::clock::wall_ms();
        for (name, settings) in sets {
            match admin.set_group(name.clone(), settings, &who, wall_ms) {
                Ok(()) => copied.set += 1,
                Err(e) => {
                    copied.refused += 1;
                    tracing::warn!(group = %name, error = %e, "region: the global tier's group is refused here");
                }
            }
        }
        for name in drops {
            match admin.drop_group(&name, &who) {
                Ok(_) => copied.dropped += 1,
                Err(e) => {
                    copied.refused += 1;
                    tracing::warn!(group = %name, error = %e, "region: a group the global tier dropped stays");
                }
            }
        }
        copied
    };
    crate::blocking::spawn(work).await.unwrap_or_default()
}

/// When the next copy is due: at once at the start, then every [`COPY_EVERY`].
#[derive(Debug, Default)]
pub struct CopyClock {
    next: Option<Nanos>,
}

impl CopyClock {
    /// Whether a copy is due at `now`; if so, the next is set [`COPY_EVERY`] later.
    pub fn due(&mut self, now: Nanos) -> bool {
        if self.next.is_some_and(|at| now < at) {
            return false;
        }
        self.next = Some(now.after(COPY_EVERY));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, limit: f64, parent: Option<&str>) -> (GroupName, GroupSettings) {
        let s = GroupSettings::builder().limit(limit).parent(parent.map(|p| GroupName::new(p).unwrap()));
        (GroupName::new(name).unwrap(), s.build().unwrap())
    }

    #[test]
    fn a_copy_sets_what_differs_parents_first_and_drops_children_first() {
        let local =
            [group("kept", 10.0, None), group("old", 5.0, None), group("old-child", 1.0, Some("old"))];
        let global =
            [group("kept", 10.0, None), group("child", 3.0, Some("parent")), group("parent", 20.0, None)];
        let (sets, drops) = plan(&local, &global);
        let names: Vec<&str> = sets.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["parent", "child"], "the unchanged one is left, the parent set first");
        let drops: Vec<&str> = drops.iter().map(GroupName::as_str).collect();
        assert_eq!(drops, ["old-child", "old"]);
    }

    #[test]
    fn a_changed_limit_is_set_and_nothing_else_moves() {
        let (sets, drops) = plan(&[group("a", 10.0, None)], &[group("a", 12.0, None)]);
        let limit = sets[0].1.limit();
        assert_eq!((sets.len(), limit, drops.len()), (1, tollgate_model::settings::Limit::Units(12.0), 0));
        let (sets, drops) = plan(&[group("a", 10.0, None)], &[group("a", 10.0, None)]);
        assert!(sets.is_empty() && drops.is_empty());
    }

    #[test]
    fn a_copy_is_due_at_once_then_every_two_seconds() {
        let mut clock = CopyClock::default();
        assert!(clock.due(Nanos(5)));
        assert!(!clock.due(Nanos(5).after(Duration::from_secs(1))));
        assert!(clock.due(Nanos(5).after(COPY_EVERY)));
    }
}
