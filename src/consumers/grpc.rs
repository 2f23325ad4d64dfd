//! `hdsd.v1.ReadinessService` over gRPC: a thin layer that reads the registry
//! and the feed, converts to protobuf and pumps watches. Served on the API
//! listener beside REST, with the same `api.tokens`.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status};

use super::paging::{page_size, PageRequest, Query, QueryError};
use super::pb;
use super::services::ServiceStatus;
use super::watch::Watches;
use crate::dataplane::DataplaneId;
use crate::feed::{ChangeKind, Event, FeedHandle, Filter, Message, ResyncReason, Subject, Zones};
use crate::registry::Registry;
use crate::view::pb::{to_pb, zone_state_of, zone_to_pb};
use crate::view::zones::ZonesView;
use crate::view::DataplaneItem;

/// The gRPC service: reads snapshots, writes nothing.
#[derive(Debug, Clone)]
pub struct ReadinessApi {
    pub registry: Registry,
    pub feed: FeedHandle,
    /// On a global: its zones as the hub publishes them.
    pub zones: Option<ZonesRx>,
    /// The API's watches, within `api.limits`.
    pub watches: Watches,
    /// The summary's and the services' counts, kept as the fleet changes.
    pub counts: super::counts::CountsHandle,
}

/// What a global's hub publishes of its zones.
pub type ZonesRx = tokio::sync::watch::Receiver<Arc<ZonesView>>;

fn unavailable(e: crate::feed::FeedClosed) -> Status {
    Status::unavailable(e.to_string())
}

fn service_zone(z: super::services::ServiceZoneItem) -> pb::ServiceZone {
    let h = &z.health;
    pb::ServiceZone {
        zone: z.zone,
        inbounds_ready: h.inbounds_ready,
        inbounds_total: h.inbounds_total,
        dataplanes: h.dataplanes,
        dataplanes_connected: h.dataplanes_connected,
        status: service_status(h.status) as i32,
    }
}

fn service_status(s: ServiceStatus) -> pb::ServiceStatus {
    match s {
        ServiceStatus::Online => pb::ServiceStatus::Online,
        ServiceStatus::PartiallyDegraded => pb::ServiceStatus::PartiallyDegraded,
        ServiceStatus::Offline => pb::ServiceStatus::Offline,
    }
}

fn dataplane_revision(e: &Event) -> Option<pb::DataplaneRevision> {
    let (mesh, name) = e.subject.mesh_name()?;
    Some(pb::DataplaneRevision {
        mesh: mesh.to_string(),
        name: name.to_string(),
        revision: e.revision,
        ready: e.ready,
        zone: e.subject.zone().map(|z| z.to_string()).unwrap_or_default(),
    })
}

fn zone_revision(e: &Event) -> Option<pb::ZoneRevision> {
    let Subject::Zone { zone, state } = &e.subject else {
        return None;
    };
    Some(pb::ZoneRevision {
        name: zone.to_string(),
        state: match e.kind {
            ChangeKind::Changed => zone_state_of(state) as i32,
            ChangeKind::Deleted => pb::ZoneState::Unspecified as i32,
        },
        revision: e.revision,
    })
}

/// One feed message as a `WatchEvent`.
pub fn to_event(message: &Message) -> pb::WatchEvent {
    use pb::watch_event::{ResyncReason as R, Type};
    let mut event = pb::WatchEvent::default();
    match message {
        Message::Snapshot { revision, items } => {
            event.set_type(Type::Snapshot);
            event.revision = *revision;
            event.snapshot = items.iter().filter_map(|e| dataplane_revision(e)).collect();
            event.zones = items.iter().filter_map(|e| zone_revision(e)).collect();
        }
        Message::Synced { revision } => {
            event.set_type(Type::Synced);
            event.revision = *revision;
        }
        Message::Event(e) => {
            let zone = matches!(e.subject, Subject::Zone { .. });
            event.set_type(match (e.kind, zone) {
                (ChangeKind::Changed, false) => Type::Changed,
                (ChangeKind::Deleted, false) => Type::Deleted,
                (ChangeKind::Changed, true) => Type::ZoneChanged,
                (ChangeKind::Deleted, true) => Type::ZoneDeleted,
            });
            event.revision = e.revision;
            event.dataplane = dataplane_revision(e);
            event.zone = zone_revision(e);
        }
        Message::Resync(reason) => {
            event.set_type(Type::Resync);
            event.set_resync_reason(match reason {
                ResyncReason::TooOld => R::TooOld,
                ResyncReason::UnknownRevision => R::UnknownRevision,
                ResyncReason::Overflow => R::Overflow,
            });
        }
    }
    event
}

fn filter(mesh: String, names: Vec<String>, selector: BTreeMap<String, String>) -> Filter {
    Filter {
        mesh: (!mesh.is_empty()).then_some(mesh),
        names: names.into_iter().collect(),
        selector,
        ..Filter::default()
    }
}

/// A paging error as gRPC's INVALID_ARGUMENT, with the same words as REST's 400.
fn invalid(e: QueryError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The filters of a list or summary request.
fn query_of(
    mesh: String,
    selector: std::collections::HashMap<String, String>,
    ready: Option<bool>,
    zone: &str,
    service: String,
    status: &[String],
) -> Result<Query, QueryError> {
    Ok(Query {
        mesh: (!mesh.is_empty()).then_some(mesh),
        service: (!service.is_empty()).then_some(service),
        selector: selector.into_iter().collect(),
        zones: Zones::from_param(Some(zone)),
        ready,
        status: super::paging::parse_status(status.iter().map(String::as_str))?,
    })
}

fn service_to_pb(s: super::services::ServiceItem) -> pb::Service {
    let h = &s.health;
    pb::Service {
        mesh: s.mesh,
        name: s.name,
        inbounds_ready: h.inbounds_ready,
        inbounds_total: h.inbounds_total,
        dataplanes: h.dataplanes,
        dataplanes_connected: h.dataplanes_connected,
        status: service_status(h.status) as i32,
        zones: s.zones.into_iter().map(service_zone).collect(),
    }
}

impl ReadinessApi {
    /// One page of the dataplanes `query` takes in, with the revision the
    /// page was taken at. The revision is read first: every change up to it
    /// is in the items. This hdsd's dataplanes, then on a global every
    /// zone's (only `zone`'s with one; `local`: only this hdsd's own).
    pub async fn list(
        &self,
        query: &Query,
        request: &PageRequest,
    ) -> Result<(u64, Vec<pb::Dataplane>, Option<String>), Status> {
        let index = self.feed.index().await.map_err(unavailable)?;
        let catalog = self.registry.catalog();
        let view = self.zones.as_ref().map(|z| z.borrow().clone());
        let page = super::paging::fleet_page(&catalog, view.as_deref(), query, request);
        let next = page.next_token(query);
        let items = page
            .items
            .into_iter()
            .map(|(key, item)| {
                let revision = match key.zone.is_empty() {
                    true => index.dataplanes.get(&key.id),
                    // The revision of its last event in this global's watch.
                    false => index.remote.get(&(Arc::from(key.zone.as_str()), key.id)),
                };
                to_pb(&item, revision.copied().unwrap_or(0))
            })
            .collect();
        Ok((index.revision, items, next))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl pb::readiness_service_server::ReadinessService for ReadinessApi {
    async fn list_dataplanes(
        &self,
        request: Request<pb::ListDataplanesRequest>,
    ) -> Result<Response<pb::ListDataplanesResponse>, Status> {
        let r = request.into_inner();
        let query = query_of(r.mesh, r.selector, r.ready, &r.zone, r.service, &r.status)
            .map_err(invalid)?;
        let size = page_size(i64::from(r.page_size)).map_err(invalid)?;
        let page = PageRequest::new(size, Some(r.page_token.as_str()), &query).map_err(invalid)?;
        let (revision, items, next) = self.list(&query, &page).await?;
        Ok(Response::new(pb::ListDataplanesResponse {
            items,
            revision,
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn get_fleet_summary(
        &self,
        request: Request<pb::GetFleetSummaryRequest>,
    ) -> Result<Response<pb::FleetSummary>, Status> {
        let r = request.into_inner();
        let query = query_of(r.mesh, r.selector, r.ready, &r.zone, r.service, &r.status)
            .map_err(invalid)?;
        let s = match self.counts.summary(&query).await {
            Some(s) => s,
            None => {
                let catalog = self.registry.catalog();
                let view = self.zones.as_ref().map(|z| z.borrow().clone());
                super::paging::fleet_summary(&catalog, view.as_deref(), &query)
            }
        };
        Ok(Response::new(pb::FleetSummary {
            dataplanes: s.dataplanes.total,
            dataplanes_ready: s.dataplanes.ready,
            dataplanes_not_ready: s.dataplanes.not_ready,
            dataplanes_connected: s.dataplanes.connected,
            dataplanes_by_class: s.dataplanes.by_class.into_iter().collect(),
            inbounds: s.inbounds.total,
            inbounds_ready: s.inbounds.ready,
            inbounds_not_ready: s.inbounds.not_ready,
            inbounds_by_status: s.inbounds.by_status.into_iter().collect(),
            services: s.services.into_iter().map(service_to_pb).collect(),
        }))
    }

    async fn get_dataplane(
        &self,
        request: Request<pb::GetDataplaneRequest>,
    ) -> Result<Response<pb::Dataplane>, Status> {
        let r = request.into_inner();
        let id = DataplaneId::new(r.mesh, r.name);
        let index = self.feed.index().await.map_err(unavailable)?;
        match self
            .registry
            .get(&id)
            .and_then(|h| DataplaneItem::from_state(&h.state()))
        {
            Some(item) => Ok(Response::new(to_pb(
                &item,
                index.dataplanes.get(&id).copied().unwrap_or(0),
            ))),
            None => Err(Status::not_found(format!(
                "dataplane {id} not found; GET /api/v1/dataplanes lists the known ones"
            ))),
        }
    }

    async fn list_services(
        &self,
        request: Request<pb::ListServicesRequest>,
    ) -> Result<Response<pb::ListServicesResponse>, Status> {
        let r = request.into_inner();
        let mesh = (!r.mesh.is_empty()).then_some(r.mesh.as_str());
        let items = match self.counts.services(mesh).await {
            Some(items) => items,
            None => {
                let view = self.zones.as_ref().map(|z| z.borrow().clone());
                super::paging::fleet_services(&self.registry.catalog(), view.as_deref(), mesh)
            }
        };
        let items = items.into_iter().map(service_to_pb).collect();
        Ok(Response::new(pb::ListServicesResponse { items }))
    }

    async fn list_zones(
        &self,
        _request: Request<pb::ListZonesRequest>,
    ) -> Result<Response<pb::ListZonesResponse>, Status> {
        let items = match &self.zones {
            Some(zones) => zones
                .borrow()
                .zones
                .iter()
                .map(|z| zone_to_pb(&z.summary))
                .collect(),
            None => Vec::new(),
        };
        Ok(Response::new(pb::ListZonesResponse { items }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let r = request.into_inner();
        // Before the filter is built from them.
        let slot = self
            .watches
            .admit_naming(r.names.len().saturating_add(r.selector.len()))
            .map_err(|refused| Status::resource_exhausted(refused.message))?;
        let f = Filter {
            zones: Zones::from_param(Some(&r.zone)),
            ..filter(r.mesh, r.names, r.selector.into_iter().collect())
        };
        let rx = self.watches.start(
            slot,
            self.feed.clone(),
            f,
            r.since_revision,
            r.snapshot_page_size as usize,
        );
        let stream = ReceiverStream::new(rx).map(|m| Ok(to_event(&m)));
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Checks `authorization: Bearer <token>` against `api.tokens` (open when empty).
#[derive(Debug, Clone)]
pub struct TokenCheck {
    pub tokens: Arc<Vec<String>>,
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.tokens.is_empty() {
            return Ok(request);
        }
        // The same rule as REST and HDS: auth::bearer.
        let presented = match request.metadata().get("authorization") {
            None => Err(crate::auth::BearerError::Missing),
            Some(v) => v
                .to_str()
                .map_err(|_| crate::auth::BearerError::NotAscii)
                .and_then(crate::auth::bearer::parse),
        };
        match presented {
            Ok(t) if crate::auth::bearer::is_api_token(&self.tokens, t) => Ok(request),
            Ok(_) => Err(Status::unauthenticated(
                "invalid API token; use one of api.tokens",
            )),
            Err(crate::auth::BearerError::Missing) => Err(Status::unauthenticated(
                "this API needs a token: send the metadata `authorization: Bearer <token>` with one of api.tokens",
            )),
            Err(e) => Err(Status::unauthenticated(format!(
                "{e}; this API needs the metadata `authorization: Bearer <token>` with one of api.tokens"
            ))),
        }
    }
}

/// The gRPC services of the API listener: `hdsd.v1.ReadinessService` (behind
/// `api.tokens`), server reflection (behind `api.tokens`) and the standard
/// `grpc.health.v1.Health` (open, like `/healthz`).
pub async fn router(api: ReadinessApi, tokens: Arc<Vec<String>>) -> axum::Router {
    use pb::readiness_service_server::ReadinessServiceServer;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<ReadinessServiceServer<ReadinessApi>>()
        .await;
    let check = TokenCheck { tokens };
    let readiness = ReadinessServiceServer::with_interceptor(api, check.clone());
    let routes = tonic::service::Routes::new(health).add_service(readiness);
    let routes = match tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
    {
        Ok(reflection) => routes.add_service(tonic::service::interceptor::InterceptedService::new(
            reflection, check,
        )),
        Err(e) => {
            tracing::warn!("gRPC server reflection is off: {e}");
            routes
        }
    };
    routes.prepare().into_axum_router()
}

/// One listener for both: requests whose content type is `application/grpc*`
/// go to `grpc`, everything else to `rest`.
pub fn by_content_type(rest: axum::Router, grpc: axum::Router) -> axum::Router {
    use tower::ServiceExt as _;
    let service = tower::service_fn(move |request: axum::extract::Request| {
        let is_grpc = request
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let target = if is_grpc { grpc.clone() } else { rest.clone() };
        async move { target.oneshot(request).await }
    });
    axum::Router::new().fallback_service(service)
}
