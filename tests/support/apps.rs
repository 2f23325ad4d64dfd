//! Test applications for probe kinds beyond a TCP connect: an HTTP/1.1 app
//! whose status can be switched, a TCP app whose answer can be switched, a
//! gRPC health server (in plaintext or over TLS), and an HTTPS app whose
//! certificate can be replaced.
//! Each binds "127.0.0.1:0" and keeps its listener, serves every connection
//! on its own thread, and stops (closing the listener) when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Accepts connections on a bound listener and hands each to `handle` on its
/// own thread until stopped. `handle` must return soon after `stop` is set.
struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Acceptor {
    fn start(
        listener: TcpListener,
        handle: impl Fn(TcpStream, &AtomicBool) + Send + Sync + 'static,
    ) -> Acceptor {
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(handle);
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut workers: Vec<JoinHandle<()>> = Vec::new();
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
                        let (handle, flag) = (handle.clone(), flag.clone());
                        workers.push(std::thread::spawn(move || handle(stream, &flag)));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::park_timeout(Duration::from_millis(5));
                    }
                    Err(_) => break,
                }
                workers.retain(|w| !w.is_finished());
            }
            drop(listener);
            for w in workers {
                let _ = w.join();
            }
        });
        Acceptor {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads from `stream` until `done(buffer)` or the peer closes; `None` when
/// stopped or closed first. Read timeouts only re-check `stop`.
fn read_until(
    stream: &mut impl Read,
    buf: &mut Vec<u8>,
    stop: &AtomicBool,
    done: impl Fn(&[u8]) -> bool,
) -> Option<()> {
    let mut chunk = [0u8; 1024];
    while !done(buf) {
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return None,
        }
    }
    Some(())
}

/// An HTTP/1.1 application answering every request with the current status
/// and closing the connection. Records the last request's head.
pub struct HttpApp {
    pub port: u16,
    status: Arc<AtomicU16>,
    last_request: Arc<Mutex<Option<String>>>,
    acceptor: Acceptor,
}

impl HttpApp {
    pub fn start(status: u16) -> HttpApp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the HTTP app");
        let port = listener.local_addr().unwrap().port();
        let status = Arc::new(AtomicU16::new(status));
        let last_request = Arc::new(Mutex::new(None));
        let (s, last) = (status.clone(), last_request.clone());
        let acceptor = Acceptor::start(listener, move |mut stream, stop| {
            let mut head = Vec::new();
            if read_until(&mut stream, &mut head, stop, |b| {
                b.windows(4).any(|w| w == b"\r\n\r\n")
            })
            .is_none()
            {
                return;
            }
            *last.lock().unwrap() = Some(String::from_utf8_lossy(&head).into_owned());
            let code = s.load(Ordering::SeqCst);
            let _ = write!(
                stream,
                "HTTP/1.1 {code} Status\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        });
        HttpApp {
            port,
            status,
            last_request,
            acceptor,
        }
    }

    /// The status every following request gets.
    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// The head (request line and headers) of the last request, if any.
    pub fn last_request(&self) -> Option<String> {
        self.last_request.lock().unwrap().clone()
    }

    pub fn stop(&mut self) {
        self.acceptor.stop();
    }
}

/// A TCP application that answers every `\n`-terminated request with the
/// current answer, keeping the connection open (as Envoy reuses it).
pub struct TcpApp {
    pub port: u16,
    answer: Arc<Mutex<Vec<u8>>>,
    received: Arc<Mutex<Vec<u8>>>,
    acceptor: Acceptor,
}

impl TcpApp {
    pub fn start(answer: &[u8]) -> TcpApp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the TCP app");
        let port = listener.local_addr().unwrap().port();
        let answer = Arc::new(Mutex::new(answer.to_vec()));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (a, r) = (answer.clone(), received.clone());
        let acceptor = Acceptor::start(listener, move |mut stream, stop| loop {
            let mut request = Vec::new();
            if read_until(&mut stream, &mut request, stop, |b| b.contains(&b'\n')).is_none() {
                return;
            }
            *r.lock().unwrap() = request;
            let answer = a.lock().unwrap().clone();
            if stream.write_all(&answer).is_err() {
                return;
            }
        });
        TcpApp {
            port,
            answer,
            received,
            acceptor,
        }
    }

    /// The answer to every following request.
    pub fn set_answer(&self, answer: &[u8]) {
        *self.answer.lock().unwrap() = answer.to_vec();
    }

    /// The last request received.
    pub fn received(&self) -> Vec<u8> {
        self.received.lock().unwrap().clone()
    }

    pub fn stop(&mut self) {
        self.acceptor.stop();
    }
}

/// A gRPC application serving `grpc.health.v1.Health` (tonic-health) for
/// one service name, over HTTP/2 without TLS. Stops when dropped.
pub struct GrpcApp {
    pub port: u16,
    pub service: String,
    reporter: tonic_health::server::HealthReporter,
    rt: tokio::runtime::Runtime,
}

impl GrpcApp {
    pub fn start(service: &str) -> GrpcApp {
        Self::start_with(service, None)
    }

    fn start_with(service: &str, tls: Option<tonic::transport::ServerTlsConfig>) -> GrpcApp {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (port, reporter) = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind the gRPC app");
            let port = listener.local_addr().unwrap().port();
            let (reporter, health) = tonic_health::server::health_reporter();
            reporter
                .set_service_status(service, tonic_health::ServingStatus::Serving)
                .await;
            let mut server = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                server = server.tls_config(tls).expect("the gRPC app's TLS");
            }
            tokio::spawn(
                server
                    .add_service(health)
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
            );
            (port, reporter)
        });
        GrpcApp {
            port,
            service: service.to_string(),
            reporter,
            rt,
        }
    }

    /// Reports SERVING (true) or NOT_SERVING (false) for the service.
    pub fn set_serving(&self, serving: bool) {
        let status = if serving {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        self.rt
            .block_on(self.reporter.set_service_status(&self.service, status));
    }
}

/// A rustls server configuration presenting `cert` and `key` (PEM files);
/// with `client_ca`, every client must present a certificate it signs.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: Option<&super::pki::Ca>,
) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca.issuer.der().clone()).unwrap();
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let chain = vec![CertificateDer::from_pem_file(cert).expect("certificate PEM")];
    let key = PrivateKeyDer::from_pem_file(key).expect("key PEM");
    Arc::new(
        builder
            .with_single_cert(chain, key)
            .expect("certificate and key"),
    )
}

/// What a [`TlsApp`] has served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsServed {
    /// Requests answered over TLS, and in plaintext.
    pub tls: u64,
    pub plaintext: u64,
    /// TLS handshakes completed (a TCP check over TLS sends no request).
    pub handshakes: u64,
    /// The SNI of the last TLS handshake (`None`: it sent none).
    pub last_sni: Option<String>,
    /// Whether the last TLS handshake's client presented a certificate.
    pub last_client_cert: bool,
    /// TLS handshakes that failed (e.g. a client without the certificate
    /// the app requires).
    pub failed_handshakes: u64,
}

/// An HTTPS application: HTTP/1.1 over TLS, answering 200 to every request
/// after `delay`, and closing the connection. Its TLS configuration (the
/// certificate, a client certificate required) can be replaced while it
/// runs. With `plaintext`, a connection that does not open with a TLS
/// handshake is served as plain HTTP on the same port.
pub struct TlsApp {
    pub port: u16,
    config: Arc<Mutex<Arc<rustls::ServerConfig>>>,
    served: Arc<Mutex<TlsServed>>,
    delay: Arc<Mutex<Duration>>,
    acceptor: Acceptor,
}

/// Reads an HTTP request head from `stream`, waits `delay`, answers 200.
fn answer_http(stream: &mut (impl Read + Write), stop: &AtomicBool, delay: Duration) -> bool {
    let mut head = Vec::new();
    if read_until(stream, &mut head, stop, |b| {
        b.windows(4).any(|w| w == b"\r\n\r\n")
    })
    .is_none()
    {
        return false;
    }
    std::thread::sleep(delay);
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
    )
    .and_then(|_| stream.flush())
    .is_ok()
}

/// Completes a server handshake on `tcp` (retrying read timeouts until `stop`).
fn handshake(
    config: Arc<rustls::ServerConfig>,
    mut tcp: TcpStream,
    stop: &AtomicBool,
) -> Option<rustls::StreamOwned<rustls::ServerConnection, TcpStream>> {
    let mut conn = rustls::ServerConnection::new(config).ok()?;
    while conn.is_handshaking() {
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        match conn.complete_io(&mut tcp) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return None,
        }
    }
    Some(rustls::StreamOwned::new(conn, tcp))
}

impl TlsApp {
    pub fn start(config: Arc<rustls::ServerConfig>, plaintext: bool) -> TlsApp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the TLS app");
        let port = listener.local_addr().unwrap().port();
        let config = Arc::new(Mutex::new(config));
        let served = Arc::new(Mutex::new(TlsServed::default()));
        let delay = Arc::new(Mutex::new(Duration::ZERO));
        let (c, s, d) = (config.clone(), served.clone(), delay.clone());
        let acceptor = Acceptor::start(listener, move |tcp, stop| {
            let delay = *d.lock().unwrap();
            // A TLS connection opens with a handshake record (0x16).
            let mut first = [0u8; 1];
            let is_tls = loop {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                match tcp.peek(&mut first) {
                    Ok(0) => return,
                    Ok(_) => break first[0] == 0x16,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return,
                }
            };
            if !is_tls {
                let mut tcp = tcp;
                if plaintext && answer_http(&mut tcp, stop, delay) {
                    s.lock().unwrap().plaintext += 1;
                }
                return;
            }
            let config = c.lock().unwrap().clone();
            let Some(mut tls) = handshake(config, tcp, stop) else {
                s.lock().unwrap().failed_handshakes += 1;
                return;
            };
            {
                let mut served = s.lock().unwrap();
                served.handshakes += 1;
                served.last_sni = tls.conn.server_name().map(str::to_string);
                served.last_client_cert =
                    tls.conn.peer_certificates().is_some_and(|c| !c.is_empty());
            }
            if answer_http(&mut tls, stop, delay) {
                tls.conn.send_close_notify();
                let _ = tls.flush();
                s.lock().unwrap().tls += 1;
            }
        });
        TlsApp {
            port,
            config,
            served,
            delay,
            acceptor,
        }
    }

    /// The configuration of every following connection.
    pub fn set_config(&self, config: Arc<rustls::ServerConfig>) {
        *self.config.lock().unwrap() = config;
    }

    /// How long every following request waits for its answer.
    pub fn set_delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    pub fn served(&self) -> TlsServed {
        self.served.lock().unwrap().clone()
    }

    pub fn stop(&mut self) {
        self.acceptor.stop();
    }
}

impl GrpcApp {
    /// [`GrpcApp::start`] over TLS (tonic's rustls: ALPN h2), presenting
    /// `cert` and `key` (PEM files).
    pub fn start_tls(service: &str, cert: &std::path::Path, key: &std::path::Path) -> GrpcApp {
        let identity = tonic::transport::Identity::from_pem(
            std::fs::read(cert).expect("certificate"),
            std::fs::read(key).expect("key"),
        );
        Self::start_with(
            service,
            Some(tonic::transport::ServerTlsConfig::new().identity(identity)),
        )
    }
}
