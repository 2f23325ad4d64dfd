//! A TCP proxy on loopback that behaves like a slow, lossy path, for hosts
//! whose kernel has no `sch_netem` (`tc qdisc ... netem`): every chunk read
//! from one side reaches the other `latency` later, and each chunk is
//! "lost" with probability `loss`, then retransmitted after a
//! retransmission timeout (`rto`, doubling at each loss in a row, as TCP
//! backs off), while the chunks behind it wait: the head-of-line stall a
//! TCP connection shows under loss. Order is kept; nothing is dropped for
//! good, which is what TCP gives the peers on top of a lossy network. The
//! losses come from a seeded generator, so one seed gives one pattern of
//! losses (per chunk; how reads split the bytes into chunks varies).
//!
//! What it does not model: the congestion window (the messages here are
//! small), fast retransmit (no stream of segments to produce duplicate
//! acks), loss of the peers' SYN (the connection is accepted at once).
//! Stops when dropped.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(10);

/// How the path behaves.
#[derive(Debug, Clone, Copy)]
pub struct Path {
    /// Added to every chunk, each way.
    pub latency: Duration,
    /// The chance that a chunk (and each of its retransmissions) is lost.
    pub loss: f64,
    /// The first retransmission timeout; doubles for each loss in a row.
    pub rto: Duration,
    pub seed: u64,
}

/// One stall: a chunk delivered later than `latency` after it was read,
/// because it was lost or waits behind one that was.
#[derive(Debug, Clone, Copy)]
pub struct Stall {
    /// When the chunk was read from its sender.
    pub at: Instant,
    /// Its delay beyond `latency`.
    pub extra: Duration,
    /// It was lost itself (not only behind a lost one).
    pub lost: bool,
    /// Client to server (`true`), or back.
    pub upstream: bool,
}

#[derive(Debug, Default)]
struct Log {
    chunks: [u64; 2],
    stalls: Vec<Stall>,
}

pub struct LossyLink {
    pub addr: SocketAddr,
    log: Arc<Mutex<Log>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// xorshift64*: a fixed sequence per seed.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl LossyLink {
    /// Proxies every connection to `target` over `path`.
    pub fn start(target: SocketAddr, path: Path) -> LossyLink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the lossy link");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Log::default()));
        let (s, l) = (stop.clone(), log.clone());
        let thread = std::thread::spawn(move || {
            let mut threads = Vec::new();
            let mut seed = path.seed.max(1);
            while !s.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(target) else {
                            continue;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        for (from, to, upstream) in [
                            (
                                client.try_clone().unwrap(),
                                server.try_clone().unwrap(),
                                true,
                            ),
                            (server, client, false),
                        ] {
                            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                            let (reading, writing, l) = (s.clone(), s.clone(), l.clone());
                            let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
                            let rng = Rng(seed | 1);
                            threads.push(std::thread::spawn(move || {
                                read_side(from, tx, path, rng, upstream, &l, &reading)
                            }));
                            threads.push(std::thread::spawn(move || write_side(to, rx, &writing)));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
                    Err(_) => break,
                }
            }
            for t in threads {
                let _ = t.join();
            }
        });
        LossyLink {
            addr,
            log,
            stop,
            thread: Some(thread),
        }
    }

    /// Every stall so far.
    pub fn stalls(&self) -> Vec<Stall> {
        self.log.lock().unwrap().stalls.clone()
    }

    /// Chunks carried: (client to server, server to client).
    pub fn chunks(&self) -> (u64, u64) {
        let c = self.log.lock().unwrap().chunks;
        (c[0], c[1])
    }
}

/// Reads chunks and schedules each one's delivery: after the one before
/// it (order), `latency` after it was read, plus its retransmissions.
fn read_side(
    mut from: TcpStream,
    to: mpsc::Sender<(Instant, Vec<u8>)>,
    path: Path,
    mut rng: Rng,
    upstream: bool,
    log: &Mutex<Log>,
    stop: &AtomicBool,
) {
    from.set_read_timeout(Some(POLL)).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) {
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.send((last, Vec::new()));
                return;
            }
            Ok(n) => {
                let now = Instant::now();
                let mut lost = Duration::ZERO;
                let mut rto = path.rto;
                while rng.unit() < path.loss {
                    lost += rto;
                    rto *= 2;
                }
                last = last.max(now + path.latency + lost);
                let extra = last - now - path.latency;
                {
                    let mut log = log.lock().unwrap();
                    log.chunks[usize::from(!upstream)] += 1;
                    if extra > POLL {
                        log.stalls.push(Stall {
                            at: now,
                            extra,
                            lost: !lost.is_zero(),
                            upstream,
                        });
                    }
                }
                if to.send((last, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => {
                let _ = to.send((last, Vec::new()));
                return;
            }
        }
    }
}

/// Delivers each chunk at its time; an empty chunk ends the direction.
fn write_side(mut to: TcpStream, from: mpsc::Receiver<(Instant, Vec<u8>)>, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let (at, bytes) = match from.recv_timeout(POLL) {
            Ok(next) => next,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        // The path's delay: wait for the chunk's time, in short steps so
        // that a drop of the link is not held up.
        while Instant::now() < at && !stop.load(Ordering::Acquire) {
            std::thread::sleep((at - Instant::now()).min(POLL));
        }
        if bytes.is_empty() {
            let _ = to.shutdown(std::net::Shutdown::Write);
            return;
        }
        if to.write_all(&bytes).is_err() {
            return;
        }
    }
}

impl Drop for LossyLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
