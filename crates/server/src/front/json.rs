//! The JSON forms of settings that several surfaces print: `/status`, `tollgate status
//! --json` and the audit log.

use tollgate_proto::v1;

/// A group's settings as JSON, priorities and modes by name: the HTTP API's
/// [`GroupSettings`](crate::front::body::GroupSettings), whose schema the OpenAPI document gives.
pub fn group_settings(s: &v1::GroupSettings) -> serde_json::Value {
    serde_json::to_value(crate::front::body::GroupSettings::from(s)).unwrap_or(serde_json::Value::Null)
}
