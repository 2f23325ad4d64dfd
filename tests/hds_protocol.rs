//! The HDS protocol as hdsd speaks it, driven by a hand-written gRPC client
//! that can send what a real Envoy never does: reports first, bad node ids,
//! foreign node ids, unknown clusters, the deprecated flat report shape,
//! duplicate streams.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::{
    address, health_check, socket_address, HealthStatus,
};
use envoy_types::pb::envoy::service::health::v3::HealthCheckSpecifier;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use hdsd::api::DataplaneItem;
use tonic::Code;

use crate::support::grpc::*;
use crate::support::*;

/// Anything hdsd should do promptly, with a margin for a loaded 2-core machine.
const PROMPT: Duration = Duration::from_secs(10);
/// "Nothing arrives" windows.
const QUIET: Duration = Duration::from_secs(1);

const WEB: &str = "default.web-01";

/// hdsd with settings that differ from each other, so the specifier shows which is which.
fn start(grace: Duration) -> Hdsd {
    Hdsd::start_with(|c| {
        c.hds.report_interval = Duration::from_millis(1500);
        c.hds.check.interval = Duration::from_millis(300);
        c.hds.check.timeout = Duration::from_millis(150);
        c.hds.check.unhealthy_threshold = 3;
        c.hds.unknown_dataplane_grace = grace;
    })
}

/// Writes `<name>.yaml` and waits until the API shows the dataplane.
fn define(hdsd: &Hdsd, name: &str, inbounds: &[(u16, u16)]) {
    hdsd.write_dataplane(&format!("{name}.yaml"), &dataplane_yaml(name, inbounds));
    wait_for_defined(hdsd, name, inbounds);
}

/// Waits until the API shows `default.<name>` with exactly these (port, servicePort) inbounds.
fn wait_for_defined(hdsd: &Hdsd, name: &str, inbounds: &[(u16, u16)]) {
    let id = format!("default.{name}");
    wait_for(&format!("{id} in the API"), PROMPT, || {
        let dp = hdsd.dataplane(&id)?;
        let got: Vec<(u16, u16)> = dp
            .inbounds
            .iter()
            .map(|i| (i.port, i.service_port))
            .collect();
        if got == inbounds {
            Ok(())
        } else {
            Err(format!("inbounds {got:?}"))
        }
    });
}

fn wait_gone(hdsd: &Hdsd, id: &str) {
    wait_for(&format!("{id} gone from the API"), PROMPT, || {
        match hdsd.dataplane(id) {
            Ok(dp) => Err(format!("still there: {dp:?}")),
            Err(e) if e.contains("404") => Ok(()),
            Err(e) => Err(e),
        }
    });
}

fn wait_connected(hdsd: &Hdsd, id: &str, connected: bool) -> DataplaneItem {
    wait_for(
        &format!("{id} connection.connected == {connected}"),
        PROMPT,
        || {
            let dp = hdsd.dataplane(id)?;
            if dp.connection.connected == connected {
                Ok(dp)
            } else {
                Err(format!("{:?}", dp.connection))
            }
        },
    )
}

fn pb(secs: i64, millis: i32) -> Option<PbDuration> {
    Some(PbDuration {
        seconds: secs,
        nanos: millis * 1_000_000,
    })
}

/// Checks a specifier against the settings of [`start`]: one cluster per
/// service port given, in order, each a fully specified TCP check of 127.0.0.1:port.
fn assert_specifier(spec: &HealthCheckSpecifier, service_ports: &[u16]) {
    assert_eq!(spec.interval, pb(1, 500), "interval = hds.report_interval");
    let expected: Vec<String> = service_ports.iter().map(|&p| probe_cluster(p)).collect();
    assert_eq!(cluster_names(spec), expected, "{spec:?}");
    for (cluster, &port) in spec.cluster_health_checks.iter().zip(service_ports) {
        assert_eq!(cluster.health_checks.len(), 1, "{cluster:?}");
        let hc = &cluster.health_checks[0];
        assert_eq!(hc.timeout, pb(0, 150), "timeout");
        assert_eq!(hc.interval, pb(0, 300), "interval");
        assert_eq!(hc.no_traffic_interval, pb(0, 300), "no_traffic_interval");
        assert_eq!(
            hc.no_traffic_healthy_interval,
            pb(0, 300),
            "no_traffic_healthy_interval"
        );
        assert_eq!(hc.healthy_threshold.map(|v| v.value), Some(1));
        assert_eq!(hc.unhealthy_threshold.map(|v| v.value), Some(3));
        assert!(
            matches!(
                hc.health_checker,
                Some(health_check::HealthChecker::TcpHealthCheck(_))
            ),
            "a TCP health checker: {hc:?}"
        );
        assert_eq!(cluster.locality_endpoints.len(), 1, "{cluster:?}");
        let endpoints = &cluster.locality_endpoints[0].endpoints;
        assert_eq!(endpoints.len(), 1, "{cluster:?}");
        let Some(address::Address::SocketAddress(sa)) = endpoints[0]
            .address
            .as_ref()
            .and_then(|a| a.address.as_ref())
        else {
            panic!("endpoint without a socket address: {cluster:?}");
        };
        assert_eq!(sa.address, "127.0.0.1");
        assert_eq!(
            sa.port_specifier,
            Some(socket_address::PortSpecifier::PortValue(u32::from(port)))
        );
    }
}

// The first-message rules (a report first, a missing or malformed node id, an
// empty message) are unit tests of the stream machine (src/hds/stream.rs).

#[test]
fn a_health_check_request_for_another_node_ends_the_stream() {
    let hdsd = start(Duration::from_secs(30));
    define(&hdsd, "web-01", &[(10001, 18080)]);
    let client = GrpcClient::connect(hdsd.hds);

    let mut s = client.open_as(WEB);
    s.expect_specifier(PROMPT);
    wait_connected(&hdsd, WEB, true);
    s.send(hc_request(Some("default.web-02")));
    let status = s.expect_status(Code::InvalidArgument, PROMPT);
    assert!(
        status.message().contains("default.web-01") && status.message().contains("default.web-02"),
        "{status:?}"
    );
    assert!(matches!(s.next(QUIET), Next::Closed), "the stream is over");
    wait_connected(&hdsd, WEB, false);

    // Same rule while the stream still waits for an unknown dataplane's file.
    let mut s = client.open_as("default.not-yet");
    s.expect_nothing(Duration::from_millis(300));
    s.send(hc_request(Some("default.someone-else")));
    let status = s.expect_status(Code::InvalidArgument, PROMPT);
    assert!(
        status.message().contains("default.someone-else"),
        "{status:?}"
    );
}

#[test]
fn every_health_check_request_gets_the_current_specifier() {
    let hdsd = start(Duration::from_secs(30));
    // Three inbounds, two distinct probe targets.
    define(
        &hdsd,
        "web-01",
        &[(10001, 18080), (10002, 18081), (10003, 18080)],
    );
    let client = GrpcClient::connect(hdsd.hds);

    let mut s = client.open_as(WEB);
    let first = s.expect_specifier(PROMPT);
    assert_specifier(&first, &[18080, 18081]);

    // A second request on the same stream is answered again, identically.
    s.send(hc_request(Some(WEB)));
    assert_eq!(s.expect_specifier(PROMPT), first);
    s.expect_nothing(Duration::from_millis(500));

    // Reconnect: a new stream is answered too.
    drop(s);
    wait_connected(&hdsd, WEB, false);
    let mut s = client.open_as(WEB);
    assert_eq!(s.expect_specifier(PROMPT), first);

    // A fresh connection, as a restarted Envoy would make.
    let other = GrpcClient::connect(hdsd.hds);
    let mut s2 = other.open_as(WEB);
    assert_eq!(s2.expect_specifier(PROMPT), first);
}

#[test]
fn an_unchanged_file_pushes_nothing_but_a_new_service_port_does() {
    let hdsd = start(Duration::from_secs(30));
    let yaml = dataplane_yaml("web-01", &[(10001, 18080)]);
    hdsd.write_dataplane("web-01.yaml", &yaml);
    wait_for_defined(&hdsd, "web-01", &[(10001, 18080)]);
    let client = GrpcClient::connect(hdsd.hds);
    let mut s = client.open_as(WEB);
    let first = s.expect_specifier(PROMPT);
    assert_specifier(&first, &[18080]);

    // Same bytes again, then a marker file: once the marker is in the API,
    // hdsd has re-read the directory, including the rewritten file.
    hdsd.write_dataplane("web-01.yaml", &yaml);
    define(&hdsd, "marker-1", &[(10001, 19001)]);
    s.expect_nothing(QUIET);

    // Only a comment differs: same definition, nothing to push either.
    hdsd.write_dataplane("web-01.yaml", &format!("# edited by hand\n{yaml}"));
    define(&hdsd, "marker-2", &[(10001, 19002)]);
    s.expect_nothing(QUIET);

    // A new servicePort is a new probe target: pushed without being asked.
    define(&hdsd, "web-01", &[(10001, 18090)]);
    let pushed = s.expect_specifier(PROMPT);
    assert_specifier(&pushed, &[18090]);
    s.expect_nothing(Duration::from_millis(500));
}

#[test]
fn reports_update_readiness_and_entries_outside_the_specifier_are_ignored() {
    let hdsd = start(Duration::from_secs(30));
    define(&hdsd, "web-01", &[(10001, 18080), (10002, 18081)]);
    let client = GrpcClient::connect(hdsd.hds);
    let mut s = client.open_as(WEB);
    s.expect_specifier(PROMPT);

    // One message: an unknown cluster, a known cluster with an endpoint it
    // does not have, a known cluster with another cluster's endpoint, and
    // one valid entry. Only the valid entry counts.
    s.send(report(&[
        ("probe_127.0.0.1:19999", 19999, HealthStatus::Healthy),
        (&probe_cluster(18081), 18082, HealthStatus::Healthy),
        (&probe_cluster(18081), 18080, HealthStatus::Healthy),
        (&probe_cluster(18080), 18080, HealthStatus::Healthy),
    ]));
    let dp = hdsd.wait_inbound(WEB, 10001, "healthy", PROMPT);
    assert!(dp.inbounds[0].health.ready);
    assert_eq!(dp.inbounds[1].health.status, "pending", "{dp:?}");
    assert!(!dp.inbounds[1].health.ready);
    assert_eq!(dp.inbounds[1].health.last_report_at, None);
    assert!(dp.connection.last_report_at.is_some());
    assert!(dp.inbounds[0].health.last_report_at.is_some());

    for (status, name, ready) in [
        (HealthStatus::Unhealthy, "unhealthy", false),
        (HealthStatus::Timeout, "timeout", false),
        (HealthStatus::Degraded, "degraded", false),
        (HealthStatus::Healthy, "healthy", true),
    ] {
        s.send(report(&[(&probe_cluster(18080), 18080, status)]));
        let dp = hdsd.wait_inbound(WEB, 10001, name, PROMPT);
        assert_eq!(dp.inbounds[0].health.ready, ready, "{name}: {dp:?}");
        assert_eq!(dp.inbounds[1].health.status, "pending", "{dp:?}");
    }

    // The second inbound too, on its own.
    s.send(report(&[(
        &probe_cluster(18081),
        18081,
        HealthStatus::Unhealthy,
    )]));
    let dp = hdsd.wait_inbound(WEB, 10002, "unhealthy", PROMPT);
    assert!(!dp.inbounds[1].health.ready);
    assert_eq!(dp.inbounds[0].health.status, "healthy");
}

#[test]
fn flat_endpoints_health_counts_only_when_cluster_endpoints_health_is_empty() {
    let hdsd = start(Duration::from_secs(30));
    define(&hdsd, "web-01", &[(10001, 18080), (10002, 18081)]);
    let client = GrpcClient::connect(hdsd.hds);
    let mut s = client.open_as(WEB);
    s.expect_specifier(PROMPT);

    // An older Envoy's report: no clusters, endpoints matched by address;
    // an address outside the specifier is ignored.
    s.send(flat_report(&[
        (19999, HealthStatus::Healthy),
        (18081, HealthStatus::Unhealthy),
    ]));
    let dp = hdsd.wait_inbound(WEB, 10002, "unhealthy", PROMPT);
    assert_eq!(dp.inbounds[0].health.status, "pending", "{dp:?}");
    s.send(flat_report(&[
        (18080, HealthStatus::Degraded),
        (18081, HealthStatus::Healthy),
    ]));
    let dp = hdsd.wait_inbound(WEB, 10002, "healthy", PROMPT);
    assert_eq!(dp.inbounds[0].health.status, "degraded", "{dp:?}");
    assert!(!dp.inbounds[0].health.ready);
    assert!(dp.inbounds[1].health.ready);

    // Both shapes in one message: the flat list is ignored.
    let mut both = health_response(&[(&probe_cluster(18080), 18080, HealthStatus::Healthy)]);
    #[allow(deprecated)]
    {
        both.endpoints_health = vec![endpoint_health(18081, HealthStatus::Unhealthy)];
    }
    s.send(report_message(both));
    let dp = hdsd.wait_inbound(WEB, 10001, "healthy", PROMPT);
    assert_eq!(dp.inbounds[1].health.status, "healthy", "{dp:?}");
}

#[test]
fn a_newer_stream_for_the_same_dataplane_replaces_the_older_one() {
    let hdsd = start(Duration::from_secs(30));
    define(&hdsd, "web-01", &[(10001, 18080), (10002, 18081)]);
    let client = GrpcClient::connect(hdsd.hds);

    let mut a = client.open_as(WEB);
    let spec = a.expect_specifier(PROMPT);
    let first_connected = wait_connected(&hdsd, WEB, true).connection.connected_at;

    let mut b = client.open_as(WEB);
    assert_eq!(b.expect_specifier(PROMPT), spec);
    let status = a.expect_status(Code::Aborted, PROMPT);
    assert!(status.message().contains("replaced"), "{status:?}");
    assert!(status.message().contains(WEB), "{status:?}");

    // A report on the replaced stream (if it can still be written) counts for nothing...
    let _ = a.try_send(report(&[(
        &probe_cluster(18080),
        18080,
        HealthStatus::Healthy,
    )]));
    // ...while the new stream's reports do.
    b.send(report(&[(
        &probe_cluster(18081),
        18081,
        HealthStatus::Unhealthy,
    )]));
    let dp = hdsd.wait_inbound(WEB, 10002, "unhealthy", PROMPT);
    assert_eq!(dp.inbounds[0].health.status, "pending", "{dp:?}");
    assert!(dp.connection.connected);
    assert!(
        dp.connection.connected_at >= first_connected,
        "connectedAt is the newer stream's: {:?} vs {first_connected:?}",
        dp.connection
    );

    // The old stream going away does not disconnect the new one.
    drop(a);
    b.send(report(&[(
        &probe_cluster(18080),
        18080,
        HealthStatus::Healthy,
    )]));
    let dp = hdsd.wait_inbound(WEB, 10001, "healthy", PROMPT);
    assert!(dp.connection.connected, "{dp:?}");
    b.expect_nothing(Duration::from_millis(500));
}

#[test]
fn a_deleted_dataplane_gets_an_empty_specifier_then_not_found_after_the_grace() {
    let hdsd = start(Duration::from_secs(1));
    define(&hdsd, "web-01", &[(10001, 18080)]);
    let client = GrpcClient::connect(hdsd.hds);
    let mut s = client.open_as(WEB);
    assert_specifier(&s.expect_specifier(PROMPT), &[18080]);

    hdsd.remove_dataplane("web-01.yaml");
    let empty = s.expect_specifier(PROMPT);
    let emptied = Instant::now();
    assert!(empty.cluster_health_checks.is_empty(), "{empty:?}");
    assert_eq!(empty.interval, pb(1, 500));

    let status = s.expect_status(Code::NotFound, PROMPT);
    let waited = emptied.elapsed();
    assert!(
        waited >= Duration::from_millis(800),
        "NOT_FOUND only after the 1s grace, came after {waited:?}"
    );
    assert!(
        status.message().contains("web-01.yaml") && status.message().contains(WEB),
        "{status:?}"
    );
    wait_gone(&hdsd, WEB);
}

#[test]
fn a_dataplane_back_within_the_grace_resumes_on_the_same_stream() {
    let hdsd = start(Duration::from_secs(20));
    define(&hdsd, "web-01", &[(10001, 18080)]);
    let client = GrpcClient::connect(hdsd.hds);
    let mut s = client.open_as(WEB);
    let first = s.expect_specifier(PROMPT);
    assert_specifier(&first, &[18080]);

    hdsd.remove_dataplane("web-01.yaml");
    let empty = s.expect_specifier(PROMPT);
    assert!(empty.cluster_health_checks.is_empty(), "{empty:?}");
    wait_gone(&hdsd, WEB);

    define(&hdsd, "web-01", &[(10001, 18080)]);
    assert_eq!(s.expect_specifier(PROMPT), first);

    // The stream keeps working: reports count, requests are answered.
    wait_connected(&hdsd, WEB, true);
    s.send(report(&[(
        &probe_cluster(18080),
        18080,
        HealthStatus::Healthy,
    )]));
    let dp = hdsd.wait_inbound(WEB, 10001, "healthy", PROMPT);
    assert!(dp.inbounds[0].health.ready);
    s.send(hc_request(Some(WEB)));
    assert_eq!(s.expect_specifier(PROMPT), first);
    // And it follows later changes.
    define(&hdsd, "web-01", &[(10001, 18090)]);
    assert_specifier(&s.expect_specifier(PROMPT), &[18090]);
}

#[test]
fn an_unknown_dataplane_waits_the_grace_then_not_found_unless_its_file_appears() {
    let hdsd = start(Duration::from_secs(1));
    let client = GrpcClient::connect(hdsd.hds);

    let opened = Instant::now();
    let mut s = client.open_as("default.ghost");
    let status = s.expect_status(Code::NotFound, PROMPT);
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_millis(800),
        "NOT_FOUND only after the 1s grace, came after {waited:?}"
    );
    assert!(
        status.message().contains("ghost.yaml") && status.message().contains("mesh: default"),
        "{status:?}"
    );
    drop(s);

    // A longer grace (a second hdsd): the file appears while the stream waits.
    let hdsd = start(Duration::from_secs(20));
    let client = GrpcClient::connect(hdsd.hds);
    let mut s = client.open_as(WEB);
    s.expect_nothing(Duration::from_millis(500));
    define(&hdsd, "web-01", &[(10001, 18080)]);
    assert_specifier(&s.expect_specifier(PROMPT), &[18080]);
    wait_connected(&hdsd, WEB, true);
}

#[test]
fn fetch_health_check_returns_the_current_specifier() {
    let hdsd = start(Duration::from_secs(30));
    define(&hdsd, "web-01", &[(10001, 18080), (10002, 18081)]);
    let client = GrpcClient::connect(hdsd.hds);

    let fetched = client.fetch(hc_request(Some(WEB))).expect("fetch");
    assert_specifier(&fetched, &[18080, 18081]);
    let mut s = client.open_as(WEB);
    assert_eq!(s.expect_specifier(PROMPT), fetched, "same as streamed");

    define(&hdsd, "web-01", &[(10001, 18090)]);
    assert_specifier(&s.expect_specifier(PROMPT), &[18090]);
    assert_specifier(&client.fetch(hc_request(Some(WEB))).unwrap(), &[18090]);

    let e = client.fetch(hc_request(Some("default.ghost"))).unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("ghost.yaml"), "{e:?}");

    for (what, message) in [
        ("no node", hc_request(None)),
        ("empty node.id", hc_request(Some(""))),
        (
            "a report",
            report(&[(&probe_cluster(18090), 18090, HealthStatus::Healthy)]),
        ),
    ] {
        let e = client.fetch(message).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
        assert!(e.message().contains("node.id"), "{what}: {e:?}");
    }
    let e = client.fetch(hc_request(Some("nodot"))).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
}

#[test]
fn connection_info_follows_the_stream() {
    let hdsd = start(Duration::from_secs(30));
    define(&hdsd, "web-01", &[(10001, 18080)]);
    let dp = hdsd.dataplane(WEB).unwrap();
    assert!(!dp.connection.connected);
    assert_eq!(dp.connection.connected_at, None);
    assert_eq!(dp.connection.last_report_at, None);

    let client = GrpcClient::connect(hdsd.hds);
    let mut s = client.open_as(WEB);
    s.expect_specifier(PROMPT);
    let dp = wait_connected(&hdsd, WEB, true);
    let first = dp
        .connection
        .connected_at
        .expect("connectedAt while connected");

    // A clean half-close: hdsd ends the stream with OK and marks it disconnected.
    s.half_close();
    assert!(matches!(s.next(PROMPT), Next::Closed));
    let dp = wait_connected(&hdsd, WEB, false);
    assert_eq!(
        dp.connection.connected_at,
        Some(first),
        "connectedAt stays after a disconnect"
    );

    // A new stream, then dropped abruptly (the HTTP/2 stream is reset).
    let mut s = client.open_as(WEB);
    s.expect_specifier(PROMPT);
    let dp = wait_connected(&hdsd, WEB, true);
    let second = dp.connection.connected_at.expect("connectedAt");
    assert!(second >= first, "{second} < {first}");
    drop(s);
    wait_connected(&hdsd, WEB, false);

    // The whole connection going away disconnects too.
    let other = GrpcClient::connect(hdsd.hds);
    let mut s = other.open_as(WEB);
    s.expect_specifier(PROMPT);
    wait_connected(&hdsd, WEB, true);
    drop(s);
    drop(other);
    wait_connected(&hdsd, WEB, false);
}

/// A HealthCheckRequest handled after the dataplane's removal was applied but
/// before the stream noticed it: the stream must still go through the grace
/// (and pick the dataplane up again when its file returns). tokio::select!
/// picks a ready branch at random, so several requests are kept in flight
/// while the file goes away, over several attempts.
#[test]
fn a_request_racing_a_deletion_still_gets_the_specifier_when_the_file_returns() {
    let hdsd = start(Duration::from_secs(20));
    let client = GrpcClient::connect(hdsd.hds);
    define(&hdsd, "web-01", &[(10001, 18080)]);
    for attempt in 0..10 {
        let mut s = client.open_as(WEB);
        let first = s.expect_specifier(PROMPT);
        assert_specifier(&first, &[18080]);
        const IN_FLIGHT: usize = 8;
        for _ in 0..IN_FLIGHT {
            s.send(hc_request(Some(WEB)));
        }
        hdsd.remove_dataplane("web-01.yaml");
        // Keep requests in flight until the empty specifier shows the removal.
        loop {
            let spec = s.expect_specifier(PROMPT);
            if spec.cluster_health_checks.is_empty() {
                break;
            }
            s.send(hc_request(Some(WEB)));
        }
        wait_gone(&hdsd, WEB);
        define(&hdsd, "web-01", &[(10001, 18080)]);
        // Back within the grace: the same stream gets its specifier again.
        let mut extra_empty = 0;
        loop {
            match s.next(Duration::from_secs(5)) {
                Next::Specifier(spec) if spec.cluster_health_checks.is_empty() => {
                    extra_empty += 1
                }
                Next::Specifier(spec) => {
                    assert_eq!(spec, first);
                    break;
                }
                other => panic!(
                    "attempt {attempt}: the file is back but the stream never got its specifier again \
                     (it answered {extra_empty} more requests with the empty specifier, then {other:?}); \
                     the API says connected = {:?}",
                    hdsd.dataplane(WEB).map(|d| d.connection.connected)
                ),
            }
        }
        drop(s);
        wait_connected(&hdsd, WEB, false);
    }
}

/// An Envoy that ends its stream right after every specifier, without a
/// report (as one crashing on it does), is flagged after three streams in a
/// row: in the API, `hdsd status` and `hdsd_dataplanes_rejecting_specifier`.
/// A stream that reports clears it.
#[test]
fn an_envoy_that_ends_every_stream_after_its_specifier_is_flagged() {
    let hdsd = start(Duration::from_secs(30));
    define(&hdsd, "web-01", &[(10001, 18080)]);
    let client = GrpcClient::connect(hdsd.hds);
    for attempt in 1..=3 {
        let mut s = client.open_as(WEB);
        s.expect_specifier(PROMPT);
        wait_connected(&hdsd, WEB, true);
        drop(s);
        let dp = wait_connected(&hdsd, WEB, false);
        if attempt < 3 {
            assert_eq!(dp.connection.problem, None, "after {attempt}: {dp:?}");
        }
    }
    let dp = wait_for("the dataplane to be flagged", PROMPT, || {
        let dp = hdsd.dataplane(WEB)?;
        dp.connection
            .problem
            .clone()
            .map(|p| (dp, p))
            .ok_or_else(|| "not flagged".to_string())
    });
    assert_eq!(dp.1.code, "specifier_rejected");
    assert!(
        dp.1.message
            .starts_with("Envoy ends the stream after every specifier"),
        "{:?}",
        dp.1
    );
    wait_for("the gauge", PROMPT, || {
        let m = hdsd.metrics();
        m.lines()
            .any(|l| l == "hdsd_dataplanes_rejecting_specifier 1")
            .then_some(())
            .ok_or(m)
    });
    assert!(hdsd
        .metrics()
        .lines()
        .any(|l| l == "hdsd_specifier_rejections_total 1"));

    // It reports: no longer flagged.
    let mut s = client.open_as(WEB);
    s.expect_specifier(PROMPT);
    s.send(report(&[(
        &probe_cluster(18080),
        18080,
        HealthStatus::Healthy,
    )]));
    hdsd.wait_inbound(WEB, 10001, "healthy", PROMPT);
    wait_for("the flag to clear", PROMPT, || {
        let dp = hdsd.dataplane(WEB)?;
        dp.connection
            .problem
            .is_none()
            .then_some(())
            .ok_or_else(|| format!("{:?}", dp.connection.problem))
    });
}
