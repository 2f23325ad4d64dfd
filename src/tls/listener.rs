//! The TLS handshake of hdsd's listeners: a [`Handshake`] for the one accept
//! loop in [`crate::net`], which admits connections, bounds them and hands
//! established TLS connections to tonic and axum.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::{Listener, ServerTls, TlsStream};
use crate::net::{Admission, ConnectionLimits, Handshake, Incoming};

/// How long a client may take to complete the TLS handshake (and send the
/// HTTP/2 preface) when no limit is configured.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Established TLS connections of one listening socket.
pub type TlsListener = Incoming<TlsStream>;

/// TLS with the configuration in force when each handshake starts.
#[derive(Debug, Clone)]
pub struct TlsHandshake(pub ServerTls);

impl Handshake for TlsHandshake {
    type Io = TlsStream;

    async fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        deadline: Instant,
    ) -> Option<TlsStream> {
        let tls = &self.0;
        let acceptor = TlsAcceptor::from(tls.current());
        match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                log_handshake_error(tls, peer, &e);
                None
            }
            Err(_) => {
                crate::metrics::connection_timed_out(tls.listener(), "handshake");
                tracing::debug!(
                    %peer,
                    section = tls.section(),
                    "TLS handshake failed: not completed within the handshake timeout; connection closed"
                );
                None
            }
        }
    }
}

impl Incoming<TlsStream> {
    /// Serves TLS on `listener` with [`HANDSHAKE_TIMEOUT`] and no connection
    /// caps (tests, tools). Must be called within a tokio runtime.
    pub fn tls(listener: TcpListener, tls: ServerTls) -> io::Result<TlsListener> {
        Self::tls_with_handshake_timeout(listener, tls, HANDSHAKE_TIMEOUT)
    }

    /// Serves TLS on `listener`; a client that has not completed its handshake
    /// within `timeout` is disconnected.
    pub fn tls_with_handshake_timeout(
        listener: TcpListener,
        tls: ServerTls,
        timeout: Duration,
    ) -> io::Result<TlsListener> {
        let admission: Arc<Admission> = Admission::new(
            tls.listener(),
            ConnectionLimits {
                max_connections: usize::MAX,
                max_connections_per_ip: usize::MAX,
                handshake_timeout: timeout,
                unauthenticated_timeout: None,
                idle_timeout: None,
            },
        );
        Incoming::new(listener, admission, TlsHandshake(tls))
    }
}

/// Why a handshake failed, in terms an operator can act on, and whether it is
/// worth a warning (a client closing early is usually a port check).
fn describe_handshake_error(tls: &ServerTls, e: &io::Error) -> (bool, String) {
    let section = tls.section();
    let Some(rustls_error) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => (
                false,
                format!("the client closed the connection before completing the handshake ({e})"),
            ),
            _ => (true, e.to_string()),
        };
    };
    use rustls::Error as E;
    let text = match rustls_error {
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => match tls.alpn() {
            Listener::Hds => format!(
                "{rustls_error}: the client does not speak TLS (plaintext gRPC?); configure TLS \
                 on the client (for Envoy: `hdsd bootstrap --ca`) or remove {section}"
            ),
            Listener::Api => format!(
                "{rustls_error}: the client does not speak TLS (plain http://?); use https:// \
                 or remove {section}"
            ),
            Listener::Zones => format!(
                "{rustls_error}: the zone does not speak TLS (zone.global is http://?); write \
                 zone.global as https:// with zone.ca, or remove {section}"
            ),
        },
        E::NoApplicationProtocol => format!(
            "{rustls_error}: the client offered none of the protocols this listener serves ({}); \
             Envoy must set alpn_protocols: [h2] in its UpstreamTlsContext",
            tls.alpn().describe()
        ),
        E::NoCertificatesPresented => format!(
            "{rustls_error}: the client presented no certificate, and {section}.client_ca requires one"
        ),
        E::InvalidCertificate(_) => format!(
            "client certificate rejected: {rustls_error}; it must be issued by the CA in {section}.client_ca"
        ),
        E::AlertReceived(alert) => format!(
            "the client refused the handshake (alert {alert:?}); if it does not trust hdsd's \
             certificate, give it the CA that issued {}",
            tls.cert_path().display()
        ),
        other => other.to_string(),
    };
    (true, text)
}

fn log_handshake_error(tls: &ServerTls, peer: SocketAddr, e: &io::Error) {
    let rejected_client_cert = matches!(
        e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_))
    );
    if rejected_client_cert {
        metrics::counter!(crate::metrics::AUTH_FAILURES, "reason" => "tls").increment(1);
    }
    let (warn, reason) = describe_handshake_error(tls, e);
    if warn {
        tracing::warn!(%peer, section = tls.section(), "TLS handshake failed: {reason}");
    } else {
        tracing::debug!(%peer, section = tls.section(), "TLS handshake failed: {reason}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testutil::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn listener_skips_failed_and_slow_handshakes() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let tls = ServerTls::load("hds.tls", &f.config, Listener::Hds).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut listener =
            TlsListener::tls_with_handshake_timeout(tcp, tls, Duration::from_secs(2)).unwrap();
        let addr = listener.local_addr();

        // A client that never speaks, one that speaks plaintext HTTP/2, one
        // without h2: none blocks the next good client or ends the stream.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let no_h2 = connect(addr, client_config(&ca, None, &[b"http/1.1"])).await;
        assert!(no_h2.is_err(), "a client without h2 must be refused");

        for _ in 0..2 {
            let client = tokio::spawn(connect(addr, client_config(&ca, None, &[b"h2"])));
            let server = tokio::time::timeout(Duration::from_secs(1), listener.next())
                .await
                .expect("a good client is not held up by the others")
                .unwrap()
                .unwrap();
            assert_eq!(
                server.get_ref().get_ref().1.alpn_protocol(),
                Some(&b"h2"[..])
            );
            assert!(server.get_ref().get_ref().0.nodelay().unwrap());
            client.await.unwrap().unwrap();
        }

        // The silent client is cut off after the timeout.
        let mut silent = _silent;
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
            .await
            .expect("the silent client is disconnected")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn mutual_tls_requires_a_client_certificate_from_the_ca() {
        let ca = Ca::new("server CA");
        let clients = Ca::new("client CA");
        let other = Ca::new("another CA");
        let f = files(&ca.server("hdsd"), Some(&clients));
        let tls = ServerTls::load("hds.tls", &f.config, Listener::Hds).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut listener = TlsListener::tls(tcp, tls).unwrap();
        let addr = listener.local_addr();

        async fn refused(addr: SocketAddr, config: rustls::ClientConfig) {
            // With TLS 1.3 the server judges the client certificate after the
            // client's handshake ends: the refusal arrives as an alert.
            let result = async {
                let mut s = connect(addr, config).await?;
                s.write_all(b"ping").await?;
                let mut buf = [0u8; 1];
                s.read(&mut buf).await
            };
            let r = tokio::time::timeout(Duration::from_secs(5), result)
                .await
                .expect("refused promptly");
            assert!(r.is_err(), "expected a refusal, got {r:?}");
        }
        refused(addr, client_config(&ca, None, &[b"h2"])).await;
        refused(
            addr,
            client_config(&ca, Some(&other.client("dp")), &[b"h2"]),
        )
        .await;

        let good = client_config(&ca, Some(&clients.client("dp")), &[b"h2"]);
        let client = tokio::spawn(connect(addr, good));
        let (server, peer) = listener.accept().await;
        let certs = server.get_ref().get_ref().1.peer_certificates().unwrap();
        assert_eq!(certs.len(), 1);
        let client = client.await.unwrap().unwrap();
        assert_eq!(peer, client.get_ref().0.local_addr().unwrap());
    }

    #[tokio::test]
    async fn axum_serves_over_the_tls_listener() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let tls = ServerTls::load("api.tls", &f.config, Listener::Api).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listener = TlsListener::tls(tcp, tls).unwrap();
        let addr = listener.local_addr();
        let app = axum::Router::new().route("/hello", axum::routing::get(|| async { "hi" }));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let mut s = connect(addr, client_config(&ca, None, &[b"http/1.1"]))
            .await
            .unwrap();
        assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
        s.write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).await.ok();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("hi"), "{response}");
        server.abort();
    }

    #[test]
    fn handshake_errors_say_what_to_do() {
        let ca = Ca::new("test CA");
        let f = files(&ca.server("hdsd"), None);
        let tls = ServerTls::load("hds.tls", &f.config, Listener::Hds).unwrap();
        let wrap = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);

        let (warn, text) = describe_handshake_error(
            &tls,
            &wrap(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType,
            )),
        );
        assert!(warn && text.contains("does not speak TLS"), "{text}");
        let (_, text) = describe_handshake_error(&tls, &wrap(rustls::Error::NoApplicationProtocol));
        assert!(text.contains("alpn_protocols: [h2]"), "{text}");
        let (_, text) =
            describe_handshake_error(&tls, &wrap(rustls::Error::NoCertificatesPresented));
        assert!(text.contains("hds.tls.client_ca requires one"), "{text}");
        let (warn, _) = describe_handshake_error(
            &tls,
            &io::Error::new(io::ErrorKind::UnexpectedEof, "tls handshake eof"),
        );
        assert!(!warn, "a client closing early is not worth a warning");
    }
}
