//! The gRPC front end: admission exchanges, backend reports, administration.
//!
//! Every request is checked against the contract's bounds and the settings rules before it
//! touches the controller; a bad one fails with `INVALID_ARGUMENT` naming the field and the
//! rule, and everyone else keeps being served.

use std::sync::Arc;

use tollgate_core::settings::{GroupName, check_group_name};
use tollgate_proto::v1::{self, admin_server::Admin, admission_server::Admission, backend_server::Backend};
use tollgate_proto::{BACKEND_ID_MAX_BYTES, CLIENT_ID_MAX_BYTES, EXCHANGE_GROUPS_MAX, REPORT_GROUPS_MAX};
use tonic::{Request, Response, Status};

use crate::controller::{AdminError, Controller};
use crate::{Clock, convert};

/// The three services over one controller.
#[derive(Clone)]
pub struct Services {
    pub(crate) controller: Arc<Controller>,
    pub(crate) clock: Clock,
    pub(crate) latency: Arc<crate::http::Latency>,
}

fn invalid(field: &str, rule: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {rule}"))
}

fn group_name(field: &str, name: &str) -> Result<GroupName, Status> {
    check_group_name(name).map_err(|e| invalid(field, e.rule))?;
    GroupName::new(name).map_err(|e| invalid(field, e.rule))
}

fn quantity(field: &str, v: f64) -> Result<f64, Status> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(invalid(field, format!("must be a finite number, at least 0; got {v}")))
    }
}

fn id(field: &str, v: &str, max: usize) -> Result<(), Status> {
    if v.is_empty() || v.len() > max || v.chars().any(char::is_control) {
        return Err(invalid(field, format!("must be 1 to {max} bytes of printable text")));
    }
    Ok(())
}

impl From<AdminError> for Status {
    fn from(e: AdminError) -> Status {
        match e {
            AdminError::Invalid(errors) => Status::invalid_argument(errors.to_string()),
            AdminError::NotFound(_) => Status::not_found(e.to_string()),
            AdminError::AlreadyExists(_) => Status::already_exists(e.to_string()),
            AdminError::Store(s) if s.is_transient() => Status::unavailable(s.to_string()),
            AdminError::Store(s) => Status::internal(s.to_string()),
        }
    }
}

#[tonic::async_trait]
impl Admission for Services {
    async fn exchange(
        &self,
        req: Request<v1::ExchangeRequest>,
    ) -> Result<Response<v1::ExchangeResponse>, Status> {
        let started = self.clock.now();
        let req = req.into_inner();
        id("client_id", &req.client_id, CLIENT_ID_MAX_BYTES)?;
        if req.groups.len() > EXCHANGE_GROUPS_MAX {
            return Err(invalid(
                "groups",
                format!("at most {EXCHANGE_GROUPS_MAX} per exchange, got {}", req.groups.len()),
            ));
        }
        let mut names = Vec::with_capacity(req.groups.len());
        for (i, g) in req.groups.iter().enumerate() {
            names.push(group_name(&format!("groups[{i}].group"), &g.group)?);
            quantity(&format!("groups[{i}].demand"), g.demand)?;
            quantity(&format!("groups[{i}].consumed"), g.consumed)?;
            quantity(&format!("groups[{i}].waiting"), g.waiting)?;
        }
        let response = self.controller.exchange(started, &req, &names);
        self.latency.record(self.clock.now().since(started));
        Ok(Response::new(response))
    }
}

#[tonic::async_trait]
impl Backend for Services {
    async fn report(&self, req: Request<v1::BackendReport>) -> Result<Response<v1::ReportAck>, Status> {
        let r = req.into_inner();
        id("backend_id", &r.backend_id, BACKEND_ID_MAX_BYTES)?;
        id("zone", &r.zone, BACKEND_ID_MAX_BYTES)?;
        match r.health {
            Some(v1::backend_report::Health::QueueBytes(q)) => {
                quantity("queue_bytes", q)?;
            }
            Some(v1::backend_report::Health::Utilisation(u)) => {
                quantity("utilisation", u)?;
            }
            None => return Err(invalid("health", "give queue_bytes or utilisation")),
        }
        if r.loads.len() > REPORT_GROUPS_MAX {
            return Err(invalid(
                "loads",
                format!("at most {REPORT_GROUPS_MAX} groups, got {}", r.loads.len()),
            ));
        }
        let mut loads = Vec::with_capacity(r.loads.len());
        for (i, l) in r.loads.iter().enumerate() {
            loads.push((
                group_name(&format!("loads[{i}].group"), &l.group)?,
                quantity(&format!("loads[{i}].units_per_s"), l.units_per_s)?,
            ));
        }
        self.controller.backend_report(self.clock.now(), &r, &loads);
        Ok(Response::new(v1::ReportAck {}))
    }
}

fn info(name: &GroupName, s: &tollgate_core::settings::GroupSettings) -> v1::GroupInfo {
    v1::GroupInfo { name: name.to_string(), settings: Some(convert::settings_to_proto(s)) }
}

#[tonic::async_trait]
impl Admin for Services {
    async fn put_group(&self, req: Request<v1::PutGroupRequest>) -> Result<Response<v1::GroupInfo>, Status> {
        let r = req.into_inner();
        let name = group_name("name", &r.name)?;
        let mode =
            v1::PutMode::try_from(r.mode).map_err(|_| invalid("mode", format!("unknown mode {}", r.mode)))?;
        let patch = r.patch.unwrap_or_default();
        let settings = self.controller.put_group(name.clone(), &patch, mode).await?;
        Ok(Response::new(info(&name, &settings)))
    }

    async fn drop_group(
        &self,
        req: Request<v1::DropGroupRequest>,
    ) -> Result<Response<v1::DropGroupResponse>, Status> {
        let r = req.into_inner();
        let name = group_name("name", &r.name)?;
        let existed = self.controller.drop_group(&name).await?;
        if !existed && !r.if_exists {
            return Err(Status::not_found(format!("group {:?} does not exist", r.name)));
        }
        Ok(Response::new(v1::DropGroupResponse { existed }))
    }

    async fn get_group(&self, req: Request<v1::GetGroupRequest>) -> Result<Response<v1::GroupInfo>, Status> {
        let name = group_name("name", &req.into_inner().name)?;
        match self.controller.group(&name) {
            Some(s) => Ok(Response::new(info(&name, &s))),
            None => Err(Status::not_found(format!("group {:?} does not exist", name.as_str()))),
        }
    }

    async fn list_groups(
        &self,
        _: Request<v1::ListGroupsRequest>,
    ) -> Result<Response<v1::ListGroupsResponse>, Status> {
        let groups = self.controller.groups().iter().map(|(n, s)| info(n, s)).collect();
        Ok(Response::new(v1::ListGroupsResponse { groups }))
    }

    async fn set_capacity(
        &self,
        req: Request<v1::SetCapacityRequest>,
    ) -> Result<Response<v1::NodeInfo>, Status> {
        let capacity = req.into_inner().capacity;
        self.controller.set_capacity(capacity).await?;
        Ok(Response::new(v1::NodeInfo { capacity }))
    }

    async fn get_node(&self, _: Request<v1::GetNodeRequest>) -> Result<Response<v1::NodeInfo>, Status> {
        Ok(Response::new(v1::NodeInfo { capacity: self.controller.capacity() }))
    }

    async fn status(&self, _: Request<v1::StatusRequest>) -> Result<Response<v1::StatusResponse>, Status> {
        Ok(Response::new(status_response(&self.controller)))
    }
}

/// The controller's status in the contract's form: what `Admin.Status` and `GET /status`
/// both answer.
pub fn status_response(controller: &Controller) -> v1::StatusResponse {
    let groups = controller
        .view()
        .into_iter()
        .map(|g| v1::GroupStatus {
            name: g.name.to_string(),
            settings: g.settings.as_ref().map(convert::settings_to_proto),
            target: g.target,
            admitted: g.admitted,
            demand: g.demand,
            busy: g.busy,
            clients: g.clients,
            throttled: g.throttled,
        })
        .collect();
    v1::StatusResponse { capacity: controller.capacity(), groups, exchanges: controller.exchanges() }
}

/// The status as JSON, for `GET /status` and `tollgate status --json` alike.
pub fn status_json(s: &v1::StatusResponse) -> serde_json::Value {
    let groups: Vec<serde_json::Value> = s
        .groups
        .iter()
        .map(|g| {
            serde_json::json!({
                "name": g.name,
                "settings": g.settings.as_ref().map(|st| serde_json::json!({
                    "reserved": st.reserved,
                    "limit": st.limit,
                    "burst": st.burst,
                    "priority": st.priority,
                    "weight": st.weight,
                    "budget": st.budget,
                })),
                "target": g.target,
                "admitted": g.admitted,
                "throttled": g.throttled,
                "demand": g.demand,
                "busy": g.busy,
                "clients": g.clients,
            })
        })
        .collect();
    serde_json::json!({ "capacity": s.capacity, "exchanges": s.exchanges, "groups": groups })
}
