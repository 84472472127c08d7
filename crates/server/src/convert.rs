//! Between the contract's messages and the core's validated types.

use tollgate_core::settings::{GroupSettings, Limit, Priority, SettingErrors};
use tollgate_proto::v1;

/// The contract's form of validated settings.
pub fn settings_to_proto(s: &GroupSettings) -> v1::GroupSettings {
    v1::GroupSettings {
        reserved: s.reserved(),
        limit: match s.limit() {
            Limit::Units(u) => Some(u),
            Limit::Unlimited => None,
        },
        burst: s.burst(),
        priority: u32::from(s.priority().level()),
        weight: s.weight(),
        budget: s.budget(),
    }
}

/// Validated settings from the contract's form; every broken rule is reported.
pub fn settings_from_proto(m: &v1::GroupSettings) -> Result<GroupSettings, SettingErrors> {
    apply_patch(
        GroupSettings::default(),
        &v1::GroupPatch {
            reserved: Some(m.reserved),
            limit: m.limit,
            unlimited: m.limit.is_none(),
            burst: m.burst,
            priority: Some(m.priority),
            weight: Some(m.weight),
            budget: m.budget,
        },
    )
}

/// `base` with the fields the patch sets changed, validated.
pub fn apply_patch(base: GroupSettings, p: &v1::GroupPatch) -> Result<GroupSettings, SettingErrors> {
    let mut b = base.to_builder();
    if let Some(r) = p.reserved {
        b = b.reserved(r);
    }
    if p.unlimited {
        b = b.limit_of(Limit::Unlimited);
    } else if let Some(l) = p.limit {
        b = b.limit(l);
    }
    if let Some(x) = p.burst {
        b = b.burst(x);
    }
    let mut errors = Vec::new();
    if let Some(level) = p.priority {
        match u8::try_from(level).ok().map(Priority::new) {
            Some(Ok(priority)) => b = b.priority(priority),
            _ => errors.push(tollgate_core::settings::SettingError::new(
                "priority",
                format!("must be 1 to 16, got {level}"),
            )),
        }
    }
    if let Some(w) = p.weight {
        b = b.weight(w);
    }
    if let Some(x) = p.budget {
        b = b.budget(x);
    }
    match b.build() {
        Ok(s) if errors.is_empty() => Ok(s),
        Ok(_) => Err(SettingErrors(errors)),
        Err(SettingErrors(more)) => {
            errors.extend(more);
            Err(SettingErrors(errors))
        }
    }
}
