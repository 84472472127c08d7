//! The gRPC front end: admission exchanges, backend reports, administration.
//!
//! Every request is checked against the contract's bounds and the settings rules before it
//! touches the engine; a bad one fails with `INVALID_ARGUMENT` naming the field and the rule,
//! and everyone else keeps being served. Admin changes, which wait on the store's disk, run on
//! tokio's blocking pool.

use std::sync::Arc;

use tollgate_model::settings::{GroupName, check_group_name};
use tollgate_proto::v1::admission_server::AdmissionServer;
use tollgate_proto::v1::backend_server::BackendServer;
use tollgate_proto::v1::{self, admin_server::Admin, admission_server::Admission, backend_server::Backend};
use tollgate_proto::wire::{AnswerWriter, BytesCodec, ExchangeView, ReportView};
use tonic::codegen::{Body, Bytes, StdError, http};
use tonic::{Request, Response, Status};

use crate::access::auth::{Caller, NewCredential, Refused, Role};
use crate::clock::Clock;
use crate::cluster::role::Route;
use crate::controller::PutMode;
use crate::convert;
use crate::error::AdminError;
use crate::node::Node;
use crate::observe::status::{Latency, Page, status_response};

/// The three services over one controller's parts.
#[derive(Clone)]
pub struct Services {
    pub(crate) node: Node,
    pub(crate) clock: Clock,
    pub(crate) latency: Arc<Latency>,
}

fn group_name(field: &str, name: &str) -> Result<GroupName, Status> {
    checked_name(field, name).map_err(Status::invalid_argument)
}

/// A group name from outside, or what is wrong with it, prefixed by `field`.
pub(crate) fn checked_name(field: &str, name: &str) -> Result<GroupName, String> {
    check_group_name(name).map_err(|e| format!("{field}: {}", e.rule))?;
    GroupName::new(name).map_err(|e| format!("{field}: {}", e.rule))
}

impl Services {
    /// The three services over `node`, on the server's clock, for callers that invoke the
    /// handlers directly rather than through [`serve`](crate::serve) (the fuzz targets do).
    pub fn new(node: Node) -> Self {
        Self { node, clock: Clock::new(), latency: Arc::new(Latency::default()) }
    }

    /// Runs an admin change on the blocking pool (it waits on the store's disk).
    async fn admin<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Node) -> Result<T, AdminError> + Send + 'static,
    ) -> Result<T, Status> {
        let node = self.node.clone();
        crate::blocking::spawn(move || f(&node))
            .await
            .map_err(|e| Status::internal(format!("admin change failed: {e}")))?
            .map_err(Status::from)
    }
}

impl Services {
    /// What an exchange must pass before the engine sees it. With a credential: its groups
    /// only, its client ids only, and unthrottled work only with the privilege (else what is
    /// reported as unthrottled is counted as ordinary demand). Says whether the caller may
    /// admit unthrottled work.
    fn check_exchange(
        &self,
        caller: Option<&Caller>,
        exchange: &mut ExchangeView<'_>,
    ) -> Result<bool, Status> {
        let privileged = match caller {
            None => true,
            // A controller passing on its own caller's exchange, which it has checked.
            Some(Caller(c)) if c.is_peer() => true,
            Some(Caller(c)) => {
                if let Some(g) = exchange.groups.iter().find(|g| !c.allows_group(g.group)) {
                    let refused = Refused::Group {
                        who: c.label(),
                        group: g.group.to_owned(),
                        patterns: c.groups.clone(),
                    };
                    return Err(refused.status());
                }
                self.node.access.bind_client(exchange.client_id, caller).map_err(|e| e.status())?;
                c.role == Ok(Role::Client) && c.unthrottled
            }
        };
        if !privileged {
            for g in &mut exchange.groups {
                g.unthrottled = 0.0;
            }
        }
        Ok(privileged)
    }

    /// An exchange as it comes off the wire, answered as it goes back: read in place and
    /// written by hand ([`tollgate_proto::wire`]), the server's way (see [`ExchangeFront`]).
    pub fn exchange_encoded(&self, req: &Request<Bytes>) -> Result<Bytes, Status> {
        let mut exchange =
            ExchangeView::decode(req.get_ref()).map_err(|e| undecodable("ExchangeRequest", &e))?;
        let caller = req.extensions().get::<Caller>();
        let privileged = self.check_exchange(caller, &mut exchange)?;
        self.answer_in_shards(&exchange, caller, privileged, &[], None)
    }

    /// Keeps the high-water marks of an exchange answered (`answered_here`) or passed on
    /// whole, made by `caller` (a client's token; another controller's is not one).
    fn note_peaks(&self, exchange: &ExchangeView<'_>, caller: Option<&Caller>, answered_here: bool) {
        let label = || caller.map(|Caller(c)| c.label()).unwrap_or_default();
        let token = caller
            .filter(|Caller(c)| !c.is_peer())
            .map(|Caller(c)| (c.id.as_str(), &label as &dyn Fn() -> String));
        if token.is_some() || answered_here {
            self.node.peaks.exchange(self.clock.now(), token, &exchange.groups, answered_here);
        }
    }

    /// Answers a checked exchange here, on the wire, each grant naming its group's shard
    /// (`shards`, in the request's order, when the groups are sharded) and the answer carrying
    /// `map` when the client holds an older one.
    fn answer_in_shards(
        &self,
        exchange: &ExchangeView<'_>,
        caller: Option<&Caller>,
        privileged: bool,
        shards: &[u16],
        map: Option<&v1::ShardMap>,
    ) -> Result<Bytes, Status> {
        let started = self.clock.now();
        let mut answer = AnswerWriter::with_capacity(exchange.groups.len());
        let rest = self.node.controller.exchange_view(started, exchange, |i, g| {
            answer.grant_in_shard(exchange.groups[i].group, g, shards.get(i).map(|&s| u32::from(s)))
        })?;
        let body = answer.finish_with_map(rest.next_exchange_ms, rest.next_tick_ms, privileged, map);
        self.latency.record(self.clock.now().since(started));
        self.note_peaks(exchange, caller, true);
        Ok(Bytes::from(body))
    }

    /// With the groups sharded, an exchange whose groups this controller all owns (a client
    /// that follows the shard map sends it only such parts), answered on the wire as an
    /// unsharded controller answers; `None` when some group is another's (or moving), for the
    /// path that splits it ([`sharded_exchange`](Self::sharded_exchange)).
    fn owned_exchange_encoded(
        &self,
        sharding: &crate::cluster::shard_routing::Sharding,
        req: &Request<Bytes>,
    ) -> Option<Result<Bytes, Status>> {
        use crate::cluster::shard_routing::Owner;
        let mut exchange = match ExchangeView::decode(req.get_ref()) {
            Ok(e) => e,
            Err(e) => {
                return Some(Err(undecodable("ExchangeRequest", &e)));
            }
        };
        let names: Vec<&str> = exchange.groups.iter().map(|g| g.group).collect();
        let shards = sharding
            .route(&self.node.controller, &names)
            .into_iter()
            .map(|r| r.and_then(|(owner, shard)| (owner == Owner::Here).then_some(shard)))
            .collect::<Option<Vec<u16>>>()?;
        let caller = req.extensions().get::<Caller>();
        let privileged = match self.check_exchange(caller, &mut exchange) {
            Ok(p) => p,
            Err(status) => return Some(Err(status)),
        };
        let forwarded = req.metadata().contains_key(crate::cluster::role::FORWARDED_METADATA);
        let map = if forwarded { None } else { exchange.shard_map_epoch.and_then(|e| sharding.map_for(e)) };
        Some(self.answer_in_shards(&exchange, caller, privileged, &shards, map.as_ref()))
    }
}

impl Services {
    /// Where `req` is answered ([`Cluster::route`](crate::cluster::role::Cluster::route)): a
    /// call another controller passed on is not passed on again.
    pub(crate) fn route<T>(&self, req: &Request<T>) -> Result<Route<'_>, Status> {
        self.node.cluster.route(req.metadata().contains_key(crate::cluster::role::FORWARDED_METADATA))
    }

    /// The one exchange path, on the wire: the call routed once ([`Cluster::route`](crate::cluster::role::Cluster::route)) and
    /// answered here at once (no allocation while this controller grants, or owns every group
    /// asked), or later, by each group's owner or by the leader.
    pub fn exchange_routed(&self, req: Request<Bytes>) -> Answer {
        let sharding = match self.route(&req) {
            Err(status) => return Answer::Ready(Some(Err(status))),
            Ok(Route::Here) => return Answer::Ready(Some(self.exchange_encoded(&req).map(Response::new))),
            Ok(Route::Leader(leader)) => {
                let services = self.clone();
                return Answer::Later(Box::pin(async move {
                    services.forward_exchange_encoded(leader, req).await.map(Response::new)
                }));
            }
            Ok(Route::Shards(shards)) => shards.sharding,
        };
        if let Some(answer) = self.owned_exchange_encoded(sharding, &req) {
            return Answer::Ready(Some(answer.map(Response::new)));
        }
        let services = self.clone();
        Answer::Later(Box::pin(async move {
            use prost::Message;
            let caller = req.extensions().get::<Caller>().cloned();
            let forwarded = req.metadata().contains_key(crate::cluster::role::FORWARDED_METADATA);
            let message = v1::ExchangeRequest::decode(req.into_inner())
                .map_err(|e| undecodable("ExchangeRequest", &e))?;
            let answer = services.sharded_exchange(caller, forwarded, message).await?;
            Ok(Response::new(Bytes::from(answer.encode_to_vec())))
        }))
    }

    /// A client's exchange on a follower, as it came off the wire: checked here as the leader
    /// would and passed on as it is, unless
    /// unthrottled work the caller may not admit must be taken out of it first. The leader's
    /// answer goes back as it is, with the caller's privilege appended when it has none (of a
    /// field given twice, the last value counts).
    async fn forward_exchange_encoded(
        &self,
        leader: Option<String>,
        req: Request<Bytes>,
    ) -> Result<Bytes, Status> {
        use prost::Message;
        let sent = req.get_ref().clone();
        let mut exchange = ExchangeView::decode(&sent).map_err(|e| undecodable("ExchangeRequest", &e))?;
        let asked_unthrottled = exchange.groups.iter().any(|g| g.unthrottled != 0.0);
        let caller = req.extensions().get::<Caller>().cloned();
        let privileged = self.check_exchange(caller.as_ref(), &mut exchange)?;
        let body = if privileged || !asked_unthrottled {
            req.into_inner()
        } else {
            let mut message = v1::ExchangeRequest::decode(req.into_inner())
                .map_err(|e| undecodable("ExchangeRequest", &e))?;
            for g in &mut message.groups {
                g.unthrottled = 0.0;
            }
            Bytes::from(message.encode_to_vec())
        };
        let answer =
            self.node.cluster.link().forward_encoded(self.clock.now(), leader, EXCHANGE_PATH, body).await?;
        // Taken by the leader, so its values were good: the token's marks are kept here.
        self.note_peaks(&exchange, caller.as_ref(), false);
        if privileged {
            return Ok(answer);
        }
        let mut out = Vec::with_capacity(answer.len() + 2);
        out.extend_from_slice(&answer);
        prost::encoding::bool::encode(UNTHROTTLED_ALLOWED_FIELD, &false, &mut out);
        Ok(Bytes::from(out))
    }

    /// A client's exchange with the groups sharded over the controllers: checked here (the
    /// caller's groups, client id and privilege) and answered by each group's owner
    /// ([`ShardExchange`](crate::cluster::shard_exchange::ShardExchange)); a call
    /// another controller passed on is answered for this controller's shards only.
    async fn sharded_exchange(
        &self,
        caller: Option<Caller>,
        forwarded: bool,
        mut message: v1::ExchangeRequest,
    ) -> Result<v1::ExchangeResponse, Status> {
        let privileged = self.check_exchange(caller.as_ref(), &mut ExchangeView::of(&message))?;
        if !privileged {
            for g in &mut message.groups {
                g.unthrottled = 0.0;
            }
        }
        let started = self.clock.now();
        let Route::Shards(shards) = self.node.cluster.route(forwarded)? else {
            return Err(Status::unavailable("the groups are not sharded over the controllers"));
        };
        let mut answer = shards.answer(started, &message, forwarded).await?;
        self.latency.record(self.clock.now().since(started));
        self.note_peaks(&ExchangeView::of(&message), caller.as_ref(), false);
        answer.unthrottled_allowed = privileged;
        Ok(answer)
    }
}

#[tonic::async_trait]
impl Admission for Services {
    /// The generated method, for callers that hold the decoded message: encoded and taken
    /// down the one exchange path ([`Services::exchange_routed`]).
    async fn exchange(
        &self,
        req: Request<v1::ExchangeRequest>,
    ) -> Result<Response<v1::ExchangeResponse>, Status> {
        use prost::Message;
        let (metadata, extensions, message) = req.into_parts();
        let body = Bytes::from(message.encode_to_vec());
        let answer = self.exchange_routed(Request::from_parts(metadata, extensions, body)).await?;
        v1::ExchangeResponse::decode(answer.into_inner())
            .map(Response::new)
            .map_err(|e| Status::internal(format!("an exchange's answer does not decode: {e}")))
    }
}

/// A generated service with one of its methods read and answered by hand, on encoded
/// messages: requests for `path` go to `method`, anything else to the generated service (which
/// answers `UNIMPLEMENTED` for a method it does not know). The same limits as the generated
/// service's: messages of at most 4 MiB, no compression.
#[derive(Clone)]
pub struct Front<G, M> {
    generated: G,
    path: &'static str,
    method: M,
}

/// The admission service as the server runs it: exchanges read and answered by hand
/// ([`Services::exchange_encoded`]).
pub type ExchangeFront = Front<AdmissionServer<Services>, EncodedExchange>;

/// The backend service as the server runs it: reports decoded and taken on the blocking pool
/// ([`Services::report_encoded`]).
pub type ReportFront = Front<BackendServer<Services>, EncodedReport>;

impl ExchangeFront {
    /// The front over `services`.
    pub fn new(services: Services) -> Self {
        Self {
            generated: AdmissionServer::new(services.clone()),
            path: EXCHANGE_PATH,
            method: EncodedExchange(services),
        }
    }
}

impl ReportFront {
    /// The front over `services`.
    pub fn new(services: Services) -> Self {
        Self {
            generated: BackendServer::new(services.clone()),
            path: REPORT_PATH,
            method: EncodedReport(services),
        }
    }
}

impl<G: tonic::server::NamedService, M> tonic::server::NamedService for Front<G, M> {
    const NAME: &'static str = G::NAME;
}

/// The exchange method, on encoded messages.
#[derive(Clone)]
pub struct EncodedExchange(Services);

impl tonic::server::UnaryService<Bytes> for EncodedExchange {
    type Response = Bytes;
    type Future = Answer;

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        self.0.exchange_routed(req)
    }
}

/// An encoded exchange's answer: made at once while this controller grants (no allocation on
/// the hot path), or later, once the leader has answered, while it follows.
pub enum Answer {
    /// Answered here (taken once polled).
    Ready(Option<Result<Response<Bytes>, Status>>),
    /// Passed on to the leader.
    Later(std::pin::Pin<Box<dyn Future<Output = Result<Response<Bytes>, Status>> + Send>>),
}

impl Future for Answer {
    type Output = Result<Response<Bytes>, Status>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            Answer::Ready(answer) => std::task::Poll::Ready(
                answer
                    .take()
                    .unwrap_or_else(|| Err(Status::internal("an exchange's answer was taken twice"))),
            ),
            Answer::Later(later) => later.as_mut().poll(cx),
        }
    }
}

/// The backend report method, on encoded messages.
#[derive(Clone)]
pub struct EncodedReport(Services);

impl tonic::server::UnaryService<Bytes> for EncodedReport {
    type Response = Bytes;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Response<Bytes>, Status>> + Send>>;

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let services = self.0.clone();
        Box::pin(async move { services.report_encoded(req).await.map(Response::new) })
    }
}

impl<G, M, B> tower::Service<http::Request<B>> for Front<G, M>
where
    M: tonic::server::UnaryService<Bytes, Response = Bytes> + Clone + Send + 'static,
    M::Future: Send,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
    G: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
            Future = std::pin::Pin<
                Box<
                    dyn Future<Output = Result<http::Response<tonic::body::Body>, std::convert::Infallible>>
                        + Send,
                >,
            >,
        >,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = G::Future;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != self.path {
            return self.generated.call(req);
        }
        let method = self.method.clone();
        Box::pin(async move { Ok(tonic::server::Grpc::new(BytesCodec).unary(method, req).await) })
    }
}

/// The field number of `ExchangeResponse.unthrottled_allowed`.
const UNTHROTTLED_ALLOWED_FIELD: u32 = 4;

/// The exchange's path: `/` the service `/` the method.
const EXCHANGE_PATH: &str = "/tollgate.v1.Admission/Exchange";
/// The backend report's path.
const REPORT_PATH: &str = "/tollgate.v1.Backend/Report";

impl Services {
    /// A backend's report as it comes off the wire: read in place ([`ReportView`]: no
    /// allocation per load), checked and taken on the blocking pool, so that a report of
    /// 10,000 loads (most of a millisecond) does not hold up the exchanges queued behind it on
    /// an async worker.
    pub async fn report_encoded(self, req: Request<Bytes>) -> Result<Bytes, Status> {
        use prost::Message;
        if let Route::Leader(leader) = self.route(&req)? {
            return self
                .node
                .cluster
                .link()
                .forward_encoded(self.clock.now(), leader, REPORT_PATH, req.into_inner())
                .await;
        }
        if !req.metadata().contains_key(crate::cluster::role::FORWARDED_METADATA) {
            self.node.cluster.share_report(REPORT_PATH, req.get_ref().clone());
        }
        let ack = self
            .take_report(move |controller, now| {
                let report =
                    ReportView::decode(req.get_ref()).map_err(|e| undecodable("BackendReport", &e))?;
                controller.backend_report(now, &report)
            })
            .await?;
        Ok(Bytes::from(ack.encode_to_vec()))
    }

    /// Runs `take` (read a report, check it, hand it to the engine) on the blocking pool.
    async fn take_report(
        &self,
        take: impl FnOnce(
            &crate::controller::Controller,
            tollgate_model::time::Nanos,
        ) -> Result<v1::ReportAck, Status>
        + Send
        + 'static,
    ) -> Result<v1::ReportAck, Status> {
        let (controller, now) = (self.node.controller.clone(), self.clock.now());
        crate::blocking::spawn(move || take(&controller, now))
            .await
            .map_err(|e| Status::internal(format!("backend report failed: {e}")))?
    }
}

#[tonic::async_trait]
impl Backend for Services {
    async fn report(&self, req: Request<v1::BackendReport>) -> Result<Response<v1::ReportAck>, Status> {
        if let Route::Leader(leader) = self.route(&req)? {
            use prost::Message;
            let body = Bytes::from(req.into_inner().encode_to_vec());
            let ack =
                self.node.cluster.link().forward_encoded(self.clock.now(), leader, REPORT_PATH, body).await?;
            let ack = v1::ReportAck::decode(ack)
                .map_err(|e| Status::internal(format!("the leader's report answer does not decode: {e}")))?;
            return Ok(Response::new(ack));
        }
        if !req.metadata().contains_key(crate::cluster::role::FORWARDED_METADATA)
            && self.node.cluster.sharding().is_some()
        {
            use prost::Message;
            let body = Bytes::from(req.get_ref().encode_to_vec());
            self.node.cluster.share_report(REPORT_PATH, body);
        }
        self.take_report(move |controller, now| {
            controller.backend_report(now, &ReportView::of(req.get_ref()))
        })
        .await
        .map(Response::new)
    }

    type WatchSettingsStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::BackendSettings, Status>> + Send>>;

    async fn watch_settings(
        &self,
        _: Request<v1::WatchSettingsRequest>,
    ) -> Result<Response<Self::WatchSettingsStream>, Status> {
        use tokio_stream::StreamExt as _;
        let Some(rx) = self.node.controller.admin().watch_settings() else {
            return Err(Status::resource_exhausted(format!(
                "at most {} backends watch the settings at once",
                crate::controller::SETTINGS_WATCHERS_MAX
            )));
        };
        // The whole set at once, then after each change; changes in quick succession are
        // sent as one (the watch keeps only the latest version).
        let controller = self.node.controller.clone();
        let sets = tokio_stream::wrappers::WatchStream::new(rx)
            .map(move |_| Ok(controller.admin().backend_settings(0)));
        Ok(Response::new(Box::pin(sets)))
    }

    async fn get_settings(
        &self,
        req: Request<v1::GetSettingsRequest>,
    ) -> Result<Response<v1::BackendSettings>, Status> {
        Ok(Response::new(self.node.controller.admin().backend_settings(req.into_inner().known_version)))
    }
}

/// Who made a change over gRPC, for the audit log: the credential when there is one, and
/// the peer's address when known.
fn who<T>(req: &Request<T>) -> String {
    let addr = req
        .extensions()
        .get::<crate::front::listen::Peer>()
        .map(|p| p.addr)
        .or_else(|| req.remote_addr())
        .map_or_else(|| "grpc".to_string(), |a| format!("grpc {a}"));
    match req.extensions().get::<Caller>() {
        Some(Caller(c)) => format!("{} {addr}", c.label()),
        None => addr,
    }
}

fn info(name: &GroupName, s: &tollgate_model::settings::GroupSettings) -> v1::GroupInfo {
    v1::GroupInfo { name: name.to_string(), settings: Some(convert::settings_to_proto(s)) }
}

fn node_info(n: crate::store::StoredNode) -> v1::NodeInfo {
    n.to_proto()
}

#[tonic::async_trait]
impl Admin for Services {
    async fn put_group(&self, req: Request<v1::PutGroupRequest>) -> Result<Response<v1::GroupInfo>, Status> {
        let who = who(&req);
        let r = req.into_inner();
        let name = group_name("name", &r.name)?;
        let mode = match v1::PutMode::try_from(r.mode) {
            Ok(v1::PutMode::Upsert) => PutMode::Upsert,
            Ok(v1::PutMode::Create) => PutMode::Create,
            Ok(v1::PutMode::Alter) => PutMode::Alter,
            Err(_) => return Err(Status::invalid_argument(format!("mode: unknown mode {}", r.mode))),
        };
        let patch = r.patch.unwrap_or_default();
        let n = name.clone();
        let settings = self
            .admin(move |c| c.controller.admin().put_group(n, &patch, mode, &who, crate::clock::wall_ms()))
            .await?;
        Ok(Response::new(info(&name, &settings)))
    }

    async fn drop_group(
        &self,
        req: Request<v1::DropGroupRequest>,
    ) -> Result<Response<v1::DropGroupResponse>, Status> {
        let who = who(&req);
        let r = req.into_inner();
        let name = group_name("name", &r.name)?;
        let existed = self.admin(move |c| c.controller.admin().drop_group(&name, &who)).await?;
        if !existed && !r.if_exists {
            return Err(Status::not_found(format!("group {:?} does not exist", r.name)));
        }
        Ok(Response::new(v1::DropGroupResponse { existed }))
    }

    async fn get_group(&self, req: Request<v1::GetGroupRequest>) -> Result<Response<v1::GroupInfo>, Status> {
        let name = group_name("name", &req.into_inner().name)?;
        match self.node.controller.admin().group(&name) {
            Some(s) => Ok(Response::new(info(&name, &s))),
            None => Err(Status::not_found(format!("group {:?} does not exist", name.as_str()))),
        }
    }

    async fn list_groups(
        &self,
        req: Request<v1::ListGroupsRequest>,
    ) -> Result<Response<v1::ListGroupsResponse>, Status> {
        let r = req.into_inner();
        let page = Page::of(r.page_size, &r.page_token).map_err(Status::invalid_argument)?;
        let all = self.node.controller.admin().groups();
        let (groups, next_page_token) = page.take(&all, |(n, _)| n.as_str());
        let groups = groups.iter().map(|(n, s)| info(n, s)).collect();
        Ok(Response::new(v1::ListGroupsResponse { groups, next_page_token }))
    }

    async fn set_capacity(
        &self,
        req: Request<v1::SetCapacityRequest>,
    ) -> Result<Response<v1::NodeInfo>, Status> {
        let who = who(&req);
        let capacity = req.into_inner().capacity;
        Ok(Response::new(node_info(
            self.admin(move |c| c.controller.admin().set_capacity(capacity, &who)).await?,
        )))
    }

    async fn set_mode(&self, req: Request<v1::SetModeRequest>) -> Result<Response<v1::NodeInfo>, Status> {
        let who = who(&req);
        let r = req.into_inner();
        let mode = v1::AllocationMode::try_from(r.mode)
            .map_err(|_| Status::invalid_argument(format!("mode: unknown mode {}", r.mode)))?;
        let mode = convert::mode_from_proto(mode);
        Ok(Response::new(node_info(self.admin(move |c| c.controller.admin().set_mode(mode, &who)).await?)))
    }

    async fn set_slow_start(
        &self,
        req: Request<v1::SetSlowStartRequest>,
    ) -> Result<Response<v1::NodeInfo>, Status> {
        let who = who(&req);
        let on = req.into_inner().on;
        Ok(Response::new(node_info(
            self.admin(move |c| c.controller.admin().set_slow_start(on, &who)).await?,
        )))
    }

    async fn set_shadow(&self, req: Request<v1::SetShadowRequest>) -> Result<Response<v1::NodeInfo>, Status> {
        let who = who(&req);
        let on = req.into_inner().on;
        Ok(Response::new(node_info(self.admin(move |c| c.controller.admin().set_shadow(on, &who)).await?)))
    }

    async fn set_throttling(
        &self,
        req: Request<v1::SetThrottlingRequest>,
    ) -> Result<Response<v1::NodeInfo>, Status> {
        let who = who(&req);
        let on = req.into_inner().on;
        Ok(Response::new(node_info(
            self.admin(move |c| c.controller.admin().set_throttling(on, &who)).await?,
        )))
    }

    async fn get_node(&self, _: Request<v1::GetNodeRequest>) -> Result<Response<v1::NodeInfo>, Status> {
        Ok(Response::new(node_info(self.node.controller.admin().node())))
    }

    type TraceStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<v1::TraceLine, Status>> + Send>>;

    async fn trace(&self, req: Request<v1::TraceRequest>) -> Result<Response<Self::TraceStream>, Status> {
        use tokio_stream::StreamExt as _;
        let group = req.into_inner().group;
        if !group.is_empty() {
            group_name("group", &group)?;
        }
        let Some(rx) = self.node.tracer.subscribe() else {
            return Err(Status::resource_exhausted(format!(
                "at most {} follow the trace at once",
                crate::observe::trace::TRACE_SUBSCRIBERS_MAX
            )));
        };
        let lines = tokio_stream::wrappers::BroadcastStream::new(rx).filter_map(move |item| match item {
            Ok(line) if group.is_empty() || line.group == group => {
                Some(Ok(v1::TraceLine { json: line.json.clone() }))
            }
            Ok(_) => None,
            Err(tokio_stream::wrappers::errors::BroadcastStreamRecvError::Lagged(n)) => {
                Some(Ok(v1::TraceLine { json: format!("{{\"event\":\"lagged\",\"skipped\":{n}}}") }))
            }
        });
        Ok(Response::new(Box::pin(lines)))
    }

    async fn audit(&self, req: Request<v1::AuditRequest>) -> Result<Response<v1::AuditResponse>, Status> {
        let r = req.into_inner();
        let limit = match r.limit {
            0 => 1000,
            n if n <= 10_000 => n as usize,
            n => return Err(Status::invalid_argument(format!("limit: at most 10000, got {n}"))),
        };
        let since = r.since_unix_ms;
        let records = self
            .admin(move |c| c.controller.admin().audit_log(since, limit).map_err(AdminError::from))
            .await?
            .into_iter()
            .map(|a| v1::AuditEntry {
                at_unix_ms: a.at_unix_ms,
                who: a.who,
                what: a.what,
                before: a.before,
                after: a.after,
            })
            .collect();
        Ok(Response::new(v1::AuditResponse { records }))
    }

    async fn create_token(
        &self,
        req: Request<v1::CreateTokenRequest>,
    ) -> Result<Response<v1::CreateTokenResponse>, Status> {
        let who = who(&req);
        let r = req.into_inner();
        let new = NewCredential {
            role: r.role,
            groups: r.groups,
            unthrottled: r.unthrottled,
            expires_in_s: r.expires_in_s,
            name: r.name,
            default_group: r.default_group,
        };
        let given = (!r.token.is_empty()).then_some(r.token);
        let echo = given.is_none();
        let (credential, token) =
            self.admin(move |c| c.access.create_token(&new, &who, given.as_deref())).await?;
        // A token given is not sent back: its holder has it already.
        let token = if echo { token } else { String::new() };
        Ok(Response::new(v1::CreateTokenResponse { token, info: Some(credential.info()) }))
    }

    async fn list_tokens(
        &self,
        _: Request<v1::ListTokensRequest>,
    ) -> Result<Response<v1::ListTokensResponse>, Status> {
        let tokens = self.node.access.tokens().iter().map(|c| c.info()).collect();
        Ok(Response::new(v1::ListTokensResponse { tokens }))
    }

    async fn revoke_token(
        &self,
        req: Request<v1::RevokeTokenRequest>,
    ) -> Result<Response<v1::TokenInfo>, Status> {
        let who = who(&req);
        let id = token_id(req.into_inner().id)?;
        let revoked = self.admin(move |c| c.access.revoke_token(&id, &who)).await?;
        Ok(Response::new(revoked.info()))
    }

    async fn set_token_group(
        &self,
        req: Request<v1::SetTokenGroupRequest>,
    ) -> Result<Response<v1::TokenInfo>, Status> {
        let who = who(&req);
        let r = req.into_inner();
        let (id, group) = (token_id(r.id)?, r.default_group);
        let changed = self.admin(move |c| c.access.set_token_group(&id, &group, &who)).await?;
        Ok(Response::new(changed.info()))
    }

    async fn set_rls_rules(&self, req: Request<v1::RlsRules>) -> Result<Response<v1::RlsRules>, Status> {
        let who = who(&req);
        let rules = tollgate_model::rls::RuleSet::from_json(&req.into_inner().rules_json)
            .map_err(Status::invalid_argument)?;
        self.admin(move |c| c.rls_rules.set(rules, &who)).await?;
        Ok(Response::new(v1::RlsRules { rules_json: self.node.rls_rules.get().to_json() }))
    }

    async fn get_rls_rules(
        &self,
        _: Request<v1::GetRlsRulesRequest>,
    ) -> Result<Response<v1::RlsRules>, Status> {
        Ok(Response::new(v1::RlsRules { rules_json: self.node.rls_rules.get().to_json() }))
    }

    async fn import_limits(
        &self,
        req: Request<v1::ImportLimitsRequest>,
    ) -> Result<Response<v1::ImportLimitsResponse>, Status> {
        let who = who(&req);
        let r = req.into_inner();
        let answer =
            self.admin(move |node| crate::settings::import_call::import_limits(node, &r, &who)).await?;
        Ok(Response::new(answer))
    }

    async fn usage(&self, req: Request<v1::UsageRequest>) -> Result<Response<v1::UsageResponse>, Status> {
        let r = req.into_inner();
        let limit = match r.limit {
            0 => 10_000,
            n if n <= 100_000 => n as usize,
            n => return Err(Status::invalid_argument(format!("limit: at most 100000, got {n}"))),
        };
        let group = if r.group.is_empty() { None } else { Some(group_name("group", &r.group)?) };
        let since = r.since_unix_ms;
        let records = self
            .admin(move |c| {
                c.controller.admin().usage(group.as_ref(), since, limit).map_err(AdminError::from)
            })
            .await?
            .into_iter()
            .map(|u| v1::UsageRecord {
                group: u.group.to_string(),
                minute_unix_ms: u.minute_unix_ms,
                consumed_total: u.meter.consumed,
                admitted_total: u.meter.admitted,
                throttled_total: u.meter.throttled,
                would_refuse_total: u.meter.would_refuse,
            })
            .collect();
        Ok(Response::new(v1::UsageResponse { records }))
    }

    async fn status(&self, req: Request<v1::StatusRequest>) -> Result<Response<v1::StatusResponse>, Status> {
        let r = req.into_inner();
        let page = Page::of(r.page_size, &r.page_token).map_err(Status::invalid_argument)?;
        Ok(Response::new(status_response(&self.node, self.clock.now(), &page)))
    }
}

/// A token's id as the admin calls take it: 16 hex digits.
fn token_id(id: String) -> Result<String, Status> {
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Status::invalid_argument(format!(
            "id: 16 hex digits, as `tollgate token list` shows, got {id:?}"
        )));
    }
    Ok(id)
}

/// The answer to a `message` that does not decode, worded as tonic words its own.
fn undecodable(message: &str, e: &dyn std::fmt::Display) -> Status {
    Status::internal(format!("failed to decode Protobuf message: {message}: {e}"))
}
