//! Test applications for probe kinds beyond a TCP connect: an HTTP/1.1 app
//! whose status can be switched, and a TCP app whose answer can be switched.
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
    stream: &mut TcpStream,
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
            tokio::spawn(
                tonic::transport::Server::builder()
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
