//! `hdsd validate` refuses every broken probe rule with its own message
//! (TLS blocks' included), and accepts every probe kind, over TLS too.

use std::process::Command;

/// Runs `hdsd validate` over a config (extra TOML) and one dataplane file.
fn validate(extra_config: &str, dataplane: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let dps = dir.path().join("dataplanes");
    std::fs::create_dir_all(&dps).unwrap();
    std::fs::write(dps.join("dp.yaml"), dataplane).unwrap();
    let config = dir.path().join("hdsd.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\n[dataplanes]\ndir = {:?}\n{extra_config}",
            dir.path().join("state").display().to_string(),
            dps.display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hdsd"))
        .args(["validate", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn dataplane(probe: &str) -> String {
    format!(
        "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  admin: {{port: 9901}}\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    serviceProbe:\n{probe}"
    )
}

#[test]
fn every_probe_kind_is_accepted() {
    for probe in [
        "      http:\n        path: /healthz\n        host: web.internal\n        expectedStatuses: [200, \"300-399\"]\n        headers: {X-Probe: hdsd}\n",
        "      http: {path: /healthz, http2: true}\n",
        "      grpc: {service: shop.Cart, authority: cart.internal}\n",
        "      grpc: {}\n",
        "      tcp: {send: \"PING\\r\\n\", receive: [\"PONG\"]}\n",
        "      tcp: {sendHex: \"50494e47\", receiveHex: [\"504f4e47\"]}\n",
        "      tcp: {}\n      port: 8081\n      address: 127.0.0.2\n",
        "      interval: 2s\n",
        "      http:\n        path: /healthz\n        tls: {caFile: /etc/envoy/ca.pem, sni: web.internal, clientCertFile: /etc/envoy/p.pem, clientKeyFile: /etc/envoy/p.key, alpn: [http/1.1]}\n",
        "      grpc: {tls: {insecureSkipVerify: true}}\n",
        "      tcp: {send: PING, receive: [PONG], tls: {caFile: /ca.pem}}\n",
        "      tcp: {tls: {enabled: false}}\n",
    ] {
        let (ok, out) = validate("", &dataplane(probe));
        assert!(ok, "{probe}: {out}");
        assert!(out.contains("ok: configuration valid, 1 dataplanes"), "{out}");
    }
}

#[test]
fn every_probe_rule_has_its_message() {
    let cases = [
        (
            "      http: {path: /a}\n      tcp: {}\n",
            "networking.inbound[0].serviceProbe: set exactly one of http, grpc, tcp (found http and tcp)",
        ),
        (
            "      http: {path: healthz}\n",
            "dataplane default.web: networking.inbound[0].serviceProbe: http.path \"healthz\" must start with '/' (e.g. /healthz)",
        ),
        (
            "      http: {path: \"/a b\"}\n",
            "http.path \"/a b\" contains a space or control character; percent-encode it (a space is %20)",
        ),
        (
            "      http: {path: /a, host: \"a b\"}\n",
            "http.host \"a b\" is not a valid Host header (no spaces or control characters, not empty)",
        ),
        (
            "      http: {path: /a, expectedStatuses: [700]}\n",
            "http.expectedStatuses: 700 is not an HTTP status; use statuses within 100-599",
        ),
        (
            "      http: {path: /a, expectedStatuses: [\"299-200\"]}\n",
            "http.expectedStatuses: range 299-200 is reversed; write the lower status first (200-299)",
        ),
        (
            "      http: {path: /a, expectedStatuses: [\"2xx\"]}\n",
            "http.expectedStatuses: \"2xx\" is neither a status (200) nor a range (\"200-299\")",
        ),
        (
            "      http: {path: /a, headers: {\"X Probe\": a}}\n",
            "http.headers: \"X Probe\" is not a valid header name",
        ),
        (
            "      http: {path: /a, headers: {Host: a}}\n",
            "http.headers: \"Host\" is set by Envoy itself and cannot be added; use http.host for the Host header",
        ),
        (
            "      http: {path: /a, headers: {X-A: \"a\\nb\"}}\n",
            "http.headers: the value of \"X-A\" contains a control character or newline; remove it",
        ),
        (
            "      grpc: {service: \"shop Cart\"}\n",
            "grpc.service \"shop Cart\" contains a space or control character",
        ),
        (
            "      grpc: {authority: \"\"}\n",
            "grpc.authority \"\" is not a valid authority",
        ),
        (
            &format!("      tcp: {{send: \"{}\"}}\n", "x".repeat(1025)),
            "tcp.send is 1025 bytes, above the limit of 1024 bytes (1 KiB); check a shorter exchange",
        ),
        (
            "      tcp: {receive: [\"\"]}\n",
            "tcp.receive is empty; remove it or give it at least one byte",
        ),
        (
            "      tcp: {sendHex: \"5\"}\n",
            "tcp.send is not hex (Odd number of digits); write pairs of hex digits, e.g. 50494e47",
        ),
        (
            "      tcp: {send: a, sendHex: \"61\"}\n",
            "tcp: set send or sendHex, not both",
        ),
        (
            "      tcp: {receive: [a], receiveHex: [\"61\"]}\n",
            "tcp: set receive or receiveHex, not both",
        ),
        (
            "      http: {path: /a, tls: {}}\n",
            "http.tls: say how Envoy verifies the application's certificate: set caFile (the CA that signs it, a PEM file on the Envoy's machine) or insecureSkipVerify: true",
        ),
        (
            "      grpc: {tls: {caFile: /ca.pem, insecureSkipVerify: true}}\n",
            "grpc.tls: caFile and insecureSkipVerify are both set; verify against the CA or skip verification, not both: remove one",
        ),
        (
            "      tcp: {tls: {caFile: ca.pem}}\n",
            "tcp.tls.caFile \"ca.pem\" is not an absolute path; give the file's absolute path on the Envoy's machine (hdsd passes it to Envoy and never reads it)",
        ),
        (
            "      http: {path: /a, tls: {caFile: /ca.pem, clientCertFile: /p.pem}}\n",
            "http.tls.clientCertFile is set but http.tls.clientKeyFile is not; a client certificate needs its private key: set both, or neither",
        ),
        (
            "      http: {path: /a, tls: {caFile: /ca.pem, sni: 10.0.0.1}}\n",
            "http.tls.sni \"10.0.0.1\" is not a host name",
        ),
        (
            "      http: {path: /a, tls: {caFile: /ca.pem, alpn: [\"h 2\"]}}\n",
            "http.tls.alpn: \"h 2\" is not an ALPN protocol id",
        ),
        (
            "      http: {path: /a, tls: {insecureSkipVerify: \"true\"}}\n",
            "expected a boolean",
        ),
        ("      port: 0\n", "port 0 is out of range; use 1-65535"),
        ("      port: 65536\n", "port 65536 is out of range; use 1-65535"),
        (
            "      address: localhost\n",
            "address \"localhost\" is not an IP literal",
        ),
    ];
    for (probe, message) in cases {
        let (ok, out) = validate("", &dataplane(probe));
        assert!(!ok, "{probe} was accepted: {out}");
        assert!(
            out.contains(message),
            "{probe}: expected {message:?} in:\n{out}"
        );
        assert!(out.contains("1 problem(s) found"), "{out}");
    }
}

#[test]
fn inbounds_sharing_a_target_must_agree_on_the_check() {
    let dp = "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    serviceProbe: {http: {path: /healthz}}\n  - port: 10002\n    servicePort: 9090\n    serviceProbe: {port: 8080, tcp: {}}\n";
    let (ok, out) = validate("", dp);
    assert!(!ok, "{out}");
    assert!(
        out.contains("networking.inbound[0] and networking.inbound[1] probe the same target 127.0.0.1:8080 with different settings; give them the same serviceProbe"),
        "{out}"
    );
}

#[test]
fn the_default_check_kind_rules() {
    let plain = "type: Dataplane\nmesh: default\nname: web\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n";
    let (ok, out) = validate("[hds.check]\nkind = \"http\"\n", plain);
    assert!(!ok);
    assert!(
        out.contains("hds.check.kind is \"http\" but hds.check.http.path is not set; set it to the path every application serves its health on (e.g. /healthz), or use kind = \"tcp\""),
        "{out}"
    );
    let (ok, out) = validate(
        "[hds.check]\nkind = \"http\"\n[hds.check.http]\npath = \"healthz\"\n",
        plain,
    );
    assert!(!ok);
    assert!(
        out.contains("hds.check.http.path \"healthz\" must start with '/' (e.g. /healthz)"),
        "{out}"
    );
    let (ok, out) = validate(
        "[hds]\ncheck_envoy_ready = false\n[hds.check]\nkind = \"http\"\n[hds.check.http]\npath = \"/healthz\"\n",
        plain,
    );
    assert!(ok, "{out}");
    // The default check over TLS, and its rules in the file's own spelling.
    let (ok, out) = validate(
        "[hds.check.tls]\nca_file = \"/etc/envoy/ca.pem\"\nsni = \"app.internal\"\n",
        plain,
    );
    assert!(ok, "{out}");
    let (ok, out) = validate(
        "[hds.check.tls]\nca_file = \"/etc/envoy/ca.pem\"\ninsecure_skip_verify = true\n",
        plain,
    );
    assert!(!ok);
    assert!(
        out.contains("hds.check.tls: ca_file and insecure_skip_verify are both set; verify against the CA or skip verification, not both: remove one"),
        "{out}"
    );
    let (ok, out) = validate("[hds.check.tls]\nsni = \"app.internal\"\n", plain);
    assert!(!ok);
    assert!(
        out.contains("set ca_file (the CA that signs it, a PEM file on the Envoy's machine) or insecure_skip_verify = true"),
        "{out}"
    );
}
