//! A TCP relay on loopback that can cut a link the way a network does: on
//! [`Relay::cut`] it stops moving bytes in both directions but keeps every
//! connection open (what a dropped route or a firewall that drops packets
//! does: no FIN, no RST, the peers' TCP connections stay established), and
//! on [`Relay::heal`] the bytes held meanwhile flow on, as TCP would
//! retransmit them. Stops when dropped.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(10);

pub struct Relay {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Relays every connection to `target`.
    pub fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (cut.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut pumps = Vec::new();
            while !s.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(target) else {
                            continue;
                        };
                        for (from, to) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, client),
                        ] {
                            let (c, s) = (c.clone(), s.clone());
                            pumps.push(std::thread::spawn(move || pump(from, to, &c, &s)));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
                    Err(_) => break,
                }
            }
            for p in pumps {
                let _ = p.join();
            }
        });
        Relay {
            addr,
            cut,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops moving bytes; connections stay open.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
    }

    /// Moves bytes again, the held ones first.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::Release);
    }
}

/// Copies `from` to `to`; while cut, reads nothing (the sender's kernel
/// buffers fill, as with a dead route) and holds what it already read.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool, stop: &AtomicBool) {
    from.set_read_timeout(Some(POLL)).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Acquire) {
        if cut.load(Ordering::Acquire) {
            std::thread::sleep(POLL);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            Ok(n) => {
                while cut.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
                    std::thread::sleep(POLL);
                }
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                let _ = to.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
