//! A framing-aware guard in front of libzmq's TCP listeners.
//!
//! libzmq bounds one inbound frame (`ZMQ_MAXMSGSIZE`) and counts queued messages
//! (high-water marks), but a peer that sends endless frames with MORE set grows a message
//! that never completes, and a subscriber that never reads is queued up to the high-water
//! mark whatever the messages weigh. So the public TCP port is ours: each peer is relayed
//! to libzmq on loopback while its inbound ZMTP framing is read (greeting, then frame
//! headers) and a message of too many frames or bytes disconnects it, and what libzmq
//! sends it is queued here up to a byte budget, past which it is disconnected as a slow
//! reader. libzmq still speaks the protocol; the guard only counts.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// What one guarded listener allows a peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Largest inbound message (all frames of a multipart message) or command, in bytes.
    pub max_message_bytes: u64,
    /// Most frames in one inbound message.
    pub max_frames: u32,
    /// What the guard does with bytes for a peer that reads slower than libzmq sends.
    pub outbound: Outbound,
    /// Most peers connected at once; more are closed at accept.
    pub max_peers: usize,
}

/// How the guard treats a peer that reads slower than libzmq sends to it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outbound {
    /// Queue up to this many bytes, then disconnect the peer (PUB: a subscriber this far
    /// behind would otherwise be queued up to libzmq's message high-water mark, whatever
    /// the messages weigh).
    Disconnect(usize),
    /// Stop reading from libzmq once this many bytes wait, so libzmq's own flow control
    /// applies (the replay ROUTER then skips the client until it reads).
    Backpressure(usize),
}

/// A running guard; dropping it stops accepting (peers already relayed run until either
/// side closes).
pub(crate) struct Guard {
    stop: Arc<AtomicBool>,
    /// Where the listener is bound (as a `tcp://` endpoint reports it).
    bound: SocketAddr,
    /// A reachable address of the listener, to wake its accept at shutdown.
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The `host:port` of a `tcp://` endpoint (`*` is every address), or `None` for another
/// transport, which is not guarded.
pub(crate) fn tcp_address(endpoint: &str) -> Option<String> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let host = match host {
        "*" => "0.0.0.0",
        h => h,
    };
    Some(format!("{host}:{port}"))
}

/// Listens on `public` (`host:port`) and relays each peer to `internal`.
pub(crate) fn start(public: &str, internal: SocketAddr, limits: Limits, name: &str) -> io::Result<Guard> {
    let addr = public
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{public}: no address")))?;
    let listener = TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    // Wake-ups go to a reachable address even when the listener binds every interface.
    let wake = if local.ip().is_unspecified() {
        let ip: std::net::IpAddr = if local.is_ipv6() {
            std::net::Ipv6Addr::LOCALHOST.into()
        } else {
            std::net::Ipv4Addr::LOCALHOST.into()
        };
        SocketAddr::new(ip, local.port())
    } else {
        local
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let peers = Arc::new(AtomicUsize::new(0));
    let thread = std::thread::Builder::new().name(format!("{name}-guard")).spawn(move || {
        for client in listener.incoming() {
            if flag.load(Ordering::SeqCst) {
                break;
            }
            let Ok(client) = client else { continue };
            if peers.load(Ordering::SeqCst) >= limits.max_peers {
                continue;
            }
            let Ok(upstream) = TcpStream::connect(internal) else { continue };
            relay(client, upstream, limits, Arc::clone(&peers));
        }
    })?;
    Ok(Guard { stop, bound: local, addr: wake, thread: Some(thread) })
}

impl Guard {
    /// The endpoint the guard listens on, as libzmq would report it.
    pub(crate) fn endpoint(&self) -> String {
        format!("tcp://{}", self.bound)
    }
}

/// Bytes queued toward a peer, with their total.
struct Outbox {
    chunks: Mutex<(VecDeque<Vec<u8>>, usize, bool)>,
    ready: Condvar,
}

/// Relays one peer: three threads (inbound, outbound read, outbound write), each closing
/// both connections when it ends so the others end too.
fn relay(client: TcpStream, upstream: TcpStream, limits: Limits, peers: Arc<AtomicUsize>) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (Ok(c2), Ok(c3), Ok(u2), Ok(u3)) =
        (client.try_clone(), client.try_clone(), upstream.try_clone(), upstream.try_clone())
    else {
        return;
    };
    peers.fetch_add(1, Ordering::SeqCst);
    let close = move |a: &TcpStream, b: &TcpStream| {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
    };
    let outbox = Arc::new(Outbox { chunks: Mutex::new((VecDeque::new(), 0, false)), ready: Condvar::new() });
    // Inbound: the peer's bytes to libzmq, framing checked.
    let spawned = std::thread::Builder::new().name("zmq-guard-in".into()).spawn({
        let (mut from, mut to) = (client, upstream);
        let peers = Arc::clone(&peers);
        let outbox = Arc::clone(&outbox);
        move || {
            let mut framing = Framing::default();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if framing.feed(&buf[..n], &limits).is_err() || to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            close(&from, &to);
            let mut q = outbox.chunks.lock().expect("outbox");
            q.2 = true;
            outbox.ready.notify_all();
            drop(q);
            peers.fetch_sub(1, Ordering::SeqCst);
        }
    });
    if spawned.is_err() {
        close(&c2, &u2);
        return;
    }
    // Outbound read: libzmq's bytes into the peer's bounded queue.
    let _ = std::thread::Builder::new().name("zmq-guard-out".into()).spawn({
        let (mut from, peer) = (u2, c2);
        let outbox = Arc::clone(&outbox);
        move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let mut q = outbox.chunks.lock().expect("outbox");
                if q.2 {
                    break;
                }
                q.1 += n;
                q.0.push_back(buf[..n].to_vec());
                outbox.ready.notify_all();
                match limits.outbound {
                    // A reader this far behind is shed.
                    Outbound::Disconnect(max) if q.1 > max => break,
                    Outbound::Disconnect(_) => {}
                    Outbound::Backpressure(pause) => {
                        while q.1 > pause && !q.2 {
                            q = outbox.ready.wait(q).expect("outbox");
                        }
                    }
                }
                drop(q);
            }
            close(&from, &peer);
            let mut q = outbox.chunks.lock().expect("outbox");
            q.2 = true;
            q.0.clear();
            q.1 = 0;
            outbox.ready.notify_all();
        }
    });
    // Outbound write: the queue to the peer.
    let _ = std::thread::Builder::new().name("zmq-guard-write".into()).spawn({
        let (mut to, upstream) = (c3, u3);
        move || {
            loop {
                let chunk = {
                    let mut q = outbox.chunks.lock().expect("outbox");
                    loop {
                        if let Some(c) = q.0.pop_front() {
                            q.1 -= c.len();
                            // A paused reader of libzmq may go on.
                            outbox.ready.notify_all();
                            break Some(c);
                        }
                        if q.2 {
                            break None;
                        }
                        q = outbox.ready.wait(q).expect("outbox");
                    }
                };
                match chunk {
                    Some(c) if to.write_all(&c).is_ok() => {}
                    _ => break,
                }
            }
            close(&to, &upstream);
        }
    });
}

/// Where the inbound parser is in the ZMTP 3 stream.
#[derive(Debug, Default)]
enum Stage {
    /// Bytes of the 64-byte greeting seen so far.
    #[default]
    Greeting,
    /// Expecting a frame's flags byte.
    Flags,
    /// Size bytes still to come (1 or 8) and those seen.
    Size { need: usize },
    /// Body bytes still to come.
    Body { left: u64 },
}

/// Counts a peer's inbound ZMTP framing: greeting, then frames of `flags, size, body`.
#[derive(Debug, Default)]
pub(crate) struct Framing {
    stage: Stage,
    greeting: Vec<u8>,
    flags: u8,
    size: Vec<u8>,
    /// Frames and bytes of the data message in progress.
    frames: u32,
    bytes: u64,
}

const GREETING_LEN: usize = 64;
const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

impl Framing {
    /// Reads `data`; an error says why the peer must be disconnected.
    pub(crate) fn feed(&mut self, mut data: &[u8], limits: &Limits) -> Result<(), &'static str> {
        while !data.is_empty() {
            match &mut self.stage {
                Stage::Greeting => {
                    let take = (GREETING_LEN - self.greeting.len()).min(data.len());
                    self.greeting.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    let g = &self.greeting;
                    if g.first().is_some_and(|&b| b != 0xFF) || g.get(9).is_some_and(|&b| b & 0x01 != 1) {
                        return Err("not a ZMTP greeting");
                    }
                    if g.get(10).is_some_and(|&major| major < 3) {
                        return Err("ZMTP before 3.0");
                    }
                    if g.len() == GREETING_LEN {
                        self.greeting = Vec::new();
                        self.stage = Stage::Flags;
                    }
                }
                Stage::Flags => {
                    let flags = data[0];
                    data = &data[1..];
                    if flags & !(MORE | LONG | COMMAND) != 0 {
                        return Err("reserved frame flags set");
                    }
                    self.flags = flags;
                    self.size.clear();
                    self.stage = Stage::Size { need: if flags & LONG != 0 { 8 } else { 1 } };
                }
                Stage::Size { need } => {
                    let take = (*need - self.size.len()).min(data.len());
                    self.size.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.size.len() < *need {
                        continue;
                    }
                    let size = self.size.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
                    if self.flags & COMMAND != 0 {
                        if size > limits.max_message_bytes {
                            return Err("command too large");
                        }
                    } else {
                        self.frames += 1;
                        self.bytes = self.bytes.saturating_add(size);
                        if self.frames > limits.max_frames {
                            return Err("too many frames in one message");
                        }
                        if self.bytes > limits.max_message_bytes {
                            return Err("message too large");
                        }
                        if self.flags & MORE == 0 {
                            self.frames = 0;
                            self.bytes = 0;
                        }
                    }
                    self.stage = if size == 0 { Stage::Flags } else { Stage::Body { left: size } };
                }
                Stage::Body { left } => {
                    let take = (*left).min(data.len() as u64) as usize;
                    data = &data[take..];
                    *left -= take as u64;
                    if *left == 0 {
                        self.stage = Stage::Flags;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_message_bytes: 100,
        max_frames: 4,
        outbound: Outbound::Disconnect(1 << 20),
        max_peers: 4,
    };

    fn greeting() -> Vec<u8> {
        let mut g = vec![0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3, 1];
        g.resize(GREETING_LEN, 0);
        g
    }

    #[test]
    fn well_formed_traffic_passes_in_any_split() {
        let mut stream = greeting();
        stream.extend_from_slice(&[COMMAND, 5, b'R', b'E', b'A', b'D', b'Y']);
        stream.extend_from_slice(&[MORE, 2, b'h', b'i', 0, 3, 1, 2, 3]);
        stream.extend_from_slice(&[LONG, 0, 0, 0, 0, 0, 0, 0, 4, 9, 9, 9, 9]);
        for split in 1..stream.len() {
            let mut f = Framing::default();
            for chunk in stream.chunks(split) {
                f.feed(chunk, &LIMITS).unwrap();
            }
            assert!(matches!(f.stage, Stage::Flags));
        }
    }

    #[test]
    fn endless_more_frames_and_big_messages_are_refused() {
        let mut f = Framing::default();
        f.feed(&greeting(), &LIMITS).unwrap();
        let empty_more = [MORE, 0];
        let mut refused = None;
        for i in 0..10 {
            if let Err(e) = f.feed(&empty_more, &LIMITS) {
                refused = Some((i, e));
                break;
            }
        }
        assert_eq!(refused, Some((4, "too many frames in one message")));
        let mut f = Framing::default();
        f.feed(&greeting(), &LIMITS).unwrap();
        assert_eq!(f.feed(&[LONG, 0, 0, 0, 0, 0, 0, 0, 101], &LIMITS), Err("message too large"));
        let mut f = Framing::default();
        assert_eq!(f.feed(b"GET / HTTP/1.1\r\n", &LIMITS), Err("not a ZMTP greeting"));
        let mut old = greeting();
        old[10] = 2;
        assert_eq!(Framing::default().feed(&old, &LIMITS), Err("ZMTP before 3.0"));
    }
}
