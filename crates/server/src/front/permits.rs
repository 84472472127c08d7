//! The HTTP API's permits: `POST /v1/acquire` admits work and hands out a permit the caller
//! keeps while the work runs, `POST /v1/release` gives it back (settling the work's real
//! cost), `POST /v1/renew` extends its lease. A group's in-flight quota (`max_in_flight`)
//! counts each permit until it is released or its lease runs out; the permits are kept in
//! [`crate::front::holds`].

// The helpers' error is the HTTP answer itself, built at most once per request.
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use tollgate_limiter::Tollgate;

use crate::access::auth::Caller;
use crate::front::api::{
    Answer, admission_handle, admit_or_answer, parse, parse_flat, rate_limit_headers, refuse, typed,
};
use crate::front::body::{AcquireBody, Acquired, ReleaseBody, Released, RenewBody, Renewed};
use crate::front::holds::{HoldError, HoldKey, Holds, lease_of, new_permit_key, parse_permit, permit_text};

#[derive(Clone)]
struct Permits {
    clock: crate::clock::Clock,
    gate: Tollgate,
    holds: Arc<Holds>,
}

/// The permit routes, admitting through `gate` and keeping permits in `holds`.
pub fn router(clock: crate::clock::Clock, gate: Tollgate, holds: Arc<Holds>) -> Router {
    Router::new()
        .route("/v1/acquire", post(acquire))
        .route("/v1/release", post(release))
        .route("/v1/renew", post(renew))
        .with_state(Permits { clock, gate, holds })
}

/// Admits `cost` units of the group's work now and keeps a permit for it until it is released
/// or its lease runs out: in a group with an in-flight quota, one of its slots. Refused as
/// `POST /v1/check` refuses.
#[utoipa::path(post, path = "/v1/acquire", operation_id = "acquire", tag = "admission", request_body = AcquireBody,
    responses((status = 200, description = "Admitted: the permit to release", body = Acquired),
        (status = 400, description = "A field breaks a rule", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 403, description = "A token not allowed this group", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 429, description = "Refused for now; Retry-After says when to try again", body = crate::front::body::Refused),
        (status = 503, description = "Too many permits held, or this controller follows another", body = crate::front::body::Problem, content_type = "application/problem+json")))]
async fn acquire(State(p): State<Permits>, ext: axum::http::Extensions, body: axum::body::Bytes) -> Answer {
    let b: AcquireBody = match parse_flat(&body) {
        Ok(b) => b,
        Err(a) => return a,
    };
    let lease = match lease_of(b.lease_s) {
        Ok(l) => l,
        Err(rule) => return refuse(StatusCode::BAD_REQUEST, "lease_s", rule),
    };
    let (handle, group) = match admission_handle(&p.gate, &ext, b.group.as_deref(), "cost", b.cost).await {
        Ok(h) => h,
        Err(a) => return a,
    };
    let permit = match admit_or_answer(&handle, group.as_str(), b.cost, b.class.class()).await {
        Ok(permit) => permit.into_owned(),
        Err(a) => return a,
    };
    let held = new_permit_key().and_then(|key| {
        p.holds.hold(key.clone(), group.as_str(), permit, p.clock.now(), lease).map(|()| key)
    });
    let key = match held {
        Ok(key) => key,
        // The permit was dropped with the refusal: nothing is counted.
        Err(e @ (HoldError::Full | HoldError::Random)) => {
            return refuse(StatusCode::SERVICE_UNAVAILABLE, "permit", e);
        }
        Err(e) => return refuse(StatusCode::CONFLICT, "permit", e),
    };
    let remaining = crate::front::rls::units_left(&handle).floor();
    let acquired = Acquired {
        admitted: true,
        group: group.to_string(),
        permit: permit_text(&key),
        lease_s: lease.as_secs_f64(),
        remaining,
    };
    let mut a = typed(StatusCode::OK, &acquired);
    rate_limit_headers(&mut a, &handle, remaining, None);
    a
}

/// The permit `text` names, if the caller may use it: 404 when it names none held (released
/// already, or its lease ran out), 403 when the caller's token is not allowed its group.
fn held_by_caller(p: &Permits, ext: &axum::http::Extensions, text: &str) -> Result<HoldKey, Answer> {
    let Some(key) = parse_permit(text) else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "permit",
            "expected `p` and 32 hex digits, as POST /v1/acquire gives it",
        ));
    };
    let Some(group) = p.holds.group_of(&key) else {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "permit",
            "not held: released already, or its lease ran out",
        ));
    };
    if let Some(Caller(c)) = ext.get::<Caller>()
        && !c.allows_group(&group)
    {
        let refused =
            crate::access::auth::Refused::Group { who: c.label(), group, patterns: c.groups.clone() };
        return Err(refuse(StatusCode::FORBIDDEN, "permit", refused));
    }
    Ok(key)
}

/// Gives a permit back: its slot is free at once. With `cost`, the work is settled at what it
/// really cost (more than admitted becomes the group's debt, less is given back).
#[utoipa::path(post, path = "/v1/release", operation_id = "release", tag = "admission", request_body = ReleaseBody,
    responses((status = 200, description = "Released", body = Released),
        (status = 400, description = "A field breaks a rule", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 403, description = "A token not allowed the permit's group", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such permit held: released already, or its lease ran out", body = crate::front::body::Problem, content_type = "application/problem+json")))]
async fn release(State(p): State<Permits>, ext: axum::http::Extensions, body: String) -> Answer {
    let b: ReleaseBody = match parse(&body) {
        Ok(b) => b,
        Err(a) => return a,
    };
    if let Some(cost) = b.cost
        && !(0.0..=crate::front::api::CHECK_COST_MAX).contains(&cost)
    {
        let rule = format!("must be from 0 to {:e}, got {cost}", crate::front::api::CHECK_COST_MAX);
        return refuse(StatusCode::BAD_REQUEST, "cost", rule);
    }
    let key = match held_by_caller(&p, &ext, &b.permit) {
        Ok(k) => k,
        Err(a) => return a,
    };
    let Some(held) = p.holds.release(&key) else {
        return refuse(StatusCode::NOT_FOUND, "permit", "not held: released already, or its lease ran out");
    };
    let admitted = held.permit.cost();
    let cost = b.cost.unwrap_or(admitted);
    let group = held.group;
    if let Err(e) = held.permit.settle(cost) {
        return refuse(StatusCode::BAD_REQUEST, "cost", e);
    }
    typed(StatusCode::OK, &Released { group, permit: b.permit, cost })
}

/// Extends a permit's lease: it is released by itself `lease_s` from now unless released
/// before.
#[utoipa::path(post, path = "/v1/renew", operation_id = "renew", tag = "admission", request_body = RenewBody,
    responses((status = 200, description = "Renewed", body = Renewed),
        (status = 400, description = "A field breaks a rule", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No token, or one refused", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 403, description = "A token not allowed the permit's group", body = crate::front::body::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such permit held: released already, or its lease ran out", body = crate::front::body::Problem, content_type = "application/problem+json")))]
async fn renew(State(p): State<Permits>, ext: axum::http::Extensions, body: String) -> Answer {
    let b: RenewBody = match parse(&body) {
        Ok(b) => b,
        Err(a) => return a,
    };
    let lease = match lease_of(b.lease_s) {
        Ok(l) => l,
        Err(rule) => return refuse(StatusCode::BAD_REQUEST, "lease_s", rule),
    };
    let key = match held_by_caller(&p, &ext, &b.permit) {
        Ok(k) => k,
        Err(a) => return a,
    };
    match p.holds.renew(&key, p.clock.now(), lease) {
        Some(group) => {
            typed(StatusCode::OK, &Renewed { group, permit: b.permit, lease_s: lease.as_secs_f64() })
        }
        None => refuse(StatusCode::NOT_FOUND, "permit", "not held: released already, or its lease ran out"),
    }
}
