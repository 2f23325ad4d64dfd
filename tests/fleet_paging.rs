//! The fleet list in pages through the real binary: 1,200 dataplanes from
//! files, listed 500 at a time over REST and gRPC, each exactly once in
//! the documented order; the server-side filters; the summary's counts;
//! the 400 (and INVALID_ARGUMENT) that says what is allowed.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::{wait_for, Hdsd, HdsdOptions};
use hdsd::consumers::paging::Summary;
use hdsd::consumers::pb;
use serde_json::Value;

const FLEET: usize = 1200;

/// Dataplane `i`: mesh `default` (even) or `payments` (odd), service
/// `svc-<i % 3>`; every tenth has its inbound `state: Ignored` (ready),
/// the others wait for a report that never comes (`pending`).
fn document(i: usize) -> String {
    let mesh = if i.is_multiple_of(2) {
        "default"
    } else {
        "payments"
    };
    let state = if i.is_multiple_of(10) {
        "    state: Ignored\n"
    } else {
        ""
    };
    format!(
        "type: Dataplane\nmesh: {mesh}\nname: dp-{i:04}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: {port}\n    servicePort: 8080\n    serviceAddress: 127.0.0.1\n{state}    tags: {{kuma.io/service: svc-{svc}}}\n",
        port = 10000 + i % 1000,
        svc = i % 3,
    )
}

/// An hdsd with the fleet defined by files (100 documents each), listed.
fn fleet() -> Hdsd {
    let hdsd = Hdsd::start(HdsdOptions::default());
    for file in 0..FLEET / 100 {
        let docs: Vec<String> = (file * 100..(file + 1) * 100).map(document).collect();
        hdsd.write_dataplane(&format!("fleet-{file:02}.yaml"), &docs.join("---\n"));
    }
    wait_for("the fleet defined", Duration::from_secs(60), || {
        let summary: Summary = hdsd.get("/api/v1/fleet/summary")?;
        match summary.dataplanes.total {
            n if n == FLEET as u64 => Ok(()),
            other => Err(format!("{other} of {FLEET} defined")),
        }
    });
    hdsd
}

/// GET `path`: (status, Link header, body as JSON).
fn get(hdsd: &Hdsd, path: &str) -> (u16, Option<String>, Value) {
    let response = ureq::get(&hdsd.api_url(path))
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap();
    let status = response.status().as_u16();
    let link = response
        .headers()
        .get("link")
        .map(|v| v.to_str().unwrap().to_string());
    let body: Value = response.into_body().read_json().unwrap();
    (status, link, body)
}

/// Every page of `path` (with `?` already in it): the names in order and
/// the number of pages.
fn every_page(hdsd: &Hdsd, path: &str) -> (Vec<String>, usize) {
    let mut names = Vec::new();
    let mut token = String::new();
    for pages in 1.. {
        let url = match token.is_empty() {
            true => path.to_string(),
            false => format!("{path}&page_token={token}"),
        };
        let (status, link, body) = get(hdsd, &url);
        assert_eq!(status, 200, "{url}: {body}");
        for item in body["items"].as_array().unwrap() {
            names.push(format!(
                "{}/{}",
                item["mesh"].as_str().unwrap(),
                item["name"].as_str().unwrap()
            ));
        }
        match body["nextPageToken"].as_str() {
            Some(next) => {
                let link = link.expect("a Link header with the next page");
                assert!(
                    link.ends_with(&format!("page_token={next}>; rel=\"next\"")),
                    "{link}"
                );
                token = next.to_string();
            }
            None => {
                assert_eq!(link, None, "no Link on the last page");
                return (names, pages);
            }
        }
    }
    unreachable!()
}

#[test]
fn rest_pages_filters_summary_and_errors() {
    let hdsd = fleet();

    // The last hour counts every inbound too, the pending ones that never
    // sent a second event included (a dataplane's first event can come
    // before the catalog that holds it).
    wait_for(
        "the history to count the fleet",
        Duration::from_secs(10),
        || {
            let history = hdsd.get_json("/api/v1/history")?;
            let last = &history["samples"]
                .as_array()
                .and_then(|s| s.last().cloned())
                .unwrap_or_default();
            let (inbounds, not_ready) = (last["inbounds"].as_u64(), last["notReady"].as_u64());
            match (inbounds, not_ready) {
                (Some(n), Some(nr)) if n == FLEET as u64 && nr == (FLEET - FLEET / 10) as u64 => {
                    Ok(())
                }
                other => Err(format!("(inbounds, notReady) = {other:?}")),
            }
        },
    );

    // 1,200 in pages of 500: three pages, every dataplane once, by mesh then name.
    let (names, pages) = every_page(&hdsd, "/api/v1/dataplanes?page_size=500");
    assert_eq!(pages, 3);
    assert_eq!(names.len(), FLEET);
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), FLEET, "no dataplane twice");
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "sorted by mesh, then name");

    // Unpaged: the first page of the default size, and the link to the next.
    let (status, link, body) = get(&hdsd, "/api/v1/dataplanes");
    assert_eq!(status, 200);
    assert_eq!(body["items"].as_array().unwrap().len(), 500);
    assert!(link.unwrap().starts_with("</api/v1/dataplanes?page_token="));
    // Above the maximum: lowered to it (1,200 fit in one page).
    let (_, link, body) = get(&hdsd, "/api/v1/dataplanes?page_size=100000");
    assert_eq!(body["items"].as_array().unwrap().len(), FLEET);
    assert_eq!((link, body.get("nextPageToken")), (None, None));

    // Filters, on the server and across pages.
    let (payments, _) = every_page(&hdsd, "/api/v1/dataplanes?mesh=payments&page_size=250");
    assert_eq!(payments.len(), FLEET / 2);
    assert!(payments.iter().all(|n| n.starts_with("payments/")));
    let (svc, _) = every_page(&hdsd, "/api/v1/dataplanes?service=svc-1&page_size=300");
    assert_eq!(svc.len(), FLEET / 3);
    let (ready, _) = every_page(&hdsd, "/api/v1/dataplanes?ready=true&page_size=50");
    assert_eq!(ready.len(), FLEET / 10);
    let (ignored, _) = every_page(
        &hdsd,
        "/api/v1/dataplanes?status=ignored,stale&page_size=50",
    );
    assert_eq!(ignored, ready, "the ready ones are the ignored ones");
    let (pending, _) = every_page(
        &hdsd,
        "/api/v1/dataplanes?ready=false&status=pending&mesh=default",
    );
    assert_eq!(pending.len(), FLEET / 2 - FLEET / 10);
    let (own, _) = every_page(&hdsd, "/api/v1/dataplanes?zone=local&page_size=5000");
    assert_eq!(own.len(), FLEET);
    let (none, _) = every_page(&hdsd, "/api/v1/dataplanes?zone=elsewhere");
    assert!(none.is_empty());

    // The summary counts what the filters take in, all pages.
    let (status, _, all) = get(&hdsd, "/api/v1/fleet/summary");
    assert_eq!(status, 200);
    assert_eq!(all["dataplanes"]["total"], FLEET);
    assert_eq!(all["dataplanes"]["ready"], FLEET / 10);
    assert_eq!(all["dataplanes"]["notReady"], FLEET - FLEET / 10);
    assert_eq!(all["dataplanes"]["byClass"]["pending"], FLEET - FLEET / 10);
    assert_eq!(all["inbounds"]["byStatus"]["ignored"], FLEET / 10);
    assert_eq!(all["inbounds"]["byStatus"]["pending"], FLEET - FLEET / 10);
    let services = all["services"].as_array().unwrap();
    assert_eq!(
        services.len(),
        6,
        "three services in two meshes: {services:?}"
    );
    let svc0 = services
        .iter()
        .find(|s| s["mesh"] == "default" && s["name"] == "svc-0")
        .unwrap();
    // default, i % 3 == 0: i % 6 == 0 (200); ready when i % 10 == 0 too (i % 30 == 0: 40).
    assert_eq!(
        (
            svc0["inboundsReady"].as_u64(),
            svc0["inboundsTotal"].as_u64()
        ),
        (Some(40), Some(200))
    );
    let (_, _, filtered) = get(&hdsd, "/api/v1/fleet/summary?mesh=default&service=svc-0");
    assert_eq!(filtered["dataplanes"]["total"], 200);
    assert_eq!(filtered["services"].as_array().unwrap().len(), 1);

    // Errors say what is wrong and what is allowed.
    let (_, _, first) = get(&hdsd, "/api/v1/dataplanes?mesh=payments&page_size=10");
    let token = first["nextPageToken"].as_str().unwrap();
    let (status, _, body) = get(&hdsd, &format!("/api/v1/dataplanes?page_token={token}"));
    assert_eq!(status, 400);
    let message = body["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("other filters") && message.contains("same mesh"),
        "{body}"
    );
    let (status, _, body) = get(&hdsd, "/api/v1/dataplanes?page_token=not-a-token");
    assert_eq!(status, 400);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("nextPageToken of the previous page"),
        "{body}"
    );
    for (bad, says) in [
        ("page_size=-1", "1 to 5000"),
        ("page_size=lots", "default of 500"),
        ("ready=maybe", "ready=true, ready=false"),
        ("status=sick", "not_probed"),
    ] {
        let (status, _, body) = get(&hdsd, &format!("/api/v1/dataplanes?{bad}"));
        assert_eq!(status, 400, "{bad}");
        assert!(
            body["error"].as_str().unwrap().contains(says),
            "{bad}: {body}"
        );
    }
    let (status, _, body) = get(&hdsd, "/api/v1/fleet/summary?page_size=5");
    assert_eq!(status, 400, "{body}");

    // The CLI follows every page and sends its filters to the server.
    let status = |args: &[&str]| -> Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hdsd"))
            .args(["status", "--json", "--api", &hdsd.api_url("")])
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(out.status.success(), "hdsd status {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let listed = status(&["--mesh", "payments", "--service", "svc-2"]);
    assert_eq!(listed["items"].as_array().unwrap().len(), FLEET / 6);
    let listed = status(&[]);
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        FLEET,
        "more than one page"
    );
}

#[test]
fn grpc_pages_with_the_same_rules() {
    let hdsd = fleet();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use pb::readiness_service_client::ReadinessServiceClient;
        let channel = hdsd.api_channel().await;
        let mut client = ReadinessServiceClient::new(channel);
        let mut names = Vec::new();
        let mut token = String::new();
        let mut pages = 0;
        loop {
            let page = client
                .list_dataplanes(pb::ListDataplanesRequest {
                    page_size: 500,
                    page_token: token.clone(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            pages += 1;
            assert!(page.revision > 0);
            names.extend(page.items.iter().map(|d| format!("{}/{}", d.mesh, d.name)));
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        assert_eq!(pages, 3);
        assert_eq!(names.len(), FLEET);
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted, "every dataplane once, in order");

        // Filters, and a token REST gave works over gRPC with the same filters.
        let (_, _, rest) = get(&hdsd, "/api/v1/dataplanes?service=svc-0&page_size=100");
        let rest_token = rest["nextPageToken"].as_str().unwrap().to_string();
        let page = client
            .list_dataplanes(pb::ListDataplanesRequest {
                service: "svc-0".into(),
                page_size: 1000,
                page_token: rest_token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.items.len(), FLEET / 3 - 100);
        assert!(page.next_page_token.is_empty());
        let page = client
            .list_dataplanes(pb::ListDataplanesRequest {
                ready: Some(true),
                status: vec!["ignored".into()],
                mesh: "default".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.items.len(), FLEET / 10);
        assert!(page.items.iter().all(|d| d.ready));

        for (request, says) in [
            (
                pb::ListDataplanesRequest {
                    page_token: rest_token,
                    ..Default::default()
                },
                "other filters",
            ),
            (
                pb::ListDataplanesRequest {
                    page_size: -3,
                    ..Default::default()
                },
                "1 to 5000",
            ),
            (
                pb::ListDataplanesRequest {
                    status: vec!["sick".into()],
                    ..Default::default()
                },
                "not an inbound status",
            ),
        ] {
            let err = client.list_dataplanes(request).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(err.message().contains(says), "{err:?}");
        }

        let summary = client
            .get_fleet_summary(pb::GetFleetSummaryRequest {
                mesh: "payments".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(summary.dataplanes, (FLEET / 2) as u64);
        assert_eq!(summary.dataplanes_ready, 0, "odd numbers are never tenths");
        assert_eq!(
            summary.inbounds_by_status.get("pending"),
            Some(&((FLEET / 2) as u64))
        );
        assert_eq!(summary.services.len(), 3);
    });
}

/// The watch's snapshot in pages (`snapshot_page_size`), over gRPC and
/// SSE: consecutive SNAPSHOT events of at most the page's size, all at one
/// revision, together every dataplane once, then SYNCED; without it one
/// SNAPSHOT holds them all.
#[test]
fn the_watch_snapshot_comes_in_pages_when_asked() {
    use std::io::BufRead as _;
    use tokio_stream::StreamExt as _;
    let hdsd = fleet();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // (page sizes, revisions, every name) of the SNAPSHOT events before SYNCED.
    let grpc = |page: u32| {
        rt.block_on(async {
            use pb::readiness_service_client::ReadinessServiceClient;
            let channel = hdsd.api_channel().await;
            let mut stream = ReadinessServiceClient::new(channel)
                .watch(pb::WatchRequest {
                    snapshot_page_size: page,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            let (mut sizes, mut revisions, mut names) = (Vec::new(), BTreeSet::new(), Vec::new());
            while let Some(event) = stream.next().await {
                let event = event.unwrap();
                match event.r#type() {
                    pb::watch_event::Type::Snapshot => {
                        sizes.push(event.snapshot.len());
                        revisions.insert(event.revision);
                        names.extend(
                            event
                                .snapshot
                                .iter()
                                .map(|d| format!("{}/{}", d.mesh, d.name)),
                        );
                    }
                    pb::watch_event::Type::Synced => {
                        assert!(
                            revisions.contains(&event.revision),
                            "SYNCED at the snapshot's revision"
                        );
                        break;
                    }
                    other => panic!("{other:?} before SYNCED"),
                }
            }
            (sizes, revisions.len(), names)
        })
    };
    let (sizes, revisions, names) = grpc(500);
    assert_eq!((sizes, revisions), (vec![500, 500, 200], 1));
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!((names.len(), unique.len()), (FLEET, FLEET));
    let (sizes, _, _) = grpc(0);
    assert_eq!(sizes, [FLEET]);

    // SSE: the same pages as `snapshot` events.
    let response = ureq::get(&hdsd.api_url("/api/v1/watch?snapshot_page_size=500"))
        .call()
        .unwrap();
    let mut lines = std::io::BufReader::new(response.into_body().into_reader()).lines();
    let mut sizes = Vec::new();
    let mut event = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_string();
            if event == "synced" {
                break;
            }
        } else if let Some(data) = line.strip_prefix("data:") {
            if event == "snapshot" {
                let data: Value = serde_json::from_str(data.trim()).unwrap();
                sizes.push(data["snapshot"].as_array().unwrap().len());
            }
        }
    }
    assert_eq!(sizes, [500, 500, 200]);
}
