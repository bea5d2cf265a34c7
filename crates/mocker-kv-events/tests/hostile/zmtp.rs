//! A hand-written ZMTP 3.0 peer over a plain TCP stream, so a test can send exactly the
//! bytes an attacker would (bad frames, giant sizes, garbage) and can choose never to read.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Every blocking read or write of a raw peer gives up after this long.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// A ZMTP 3.0 greeting with the NULL mechanism, as a client (`as-server` 0).
pub fn greeting() -> Vec<u8> {
    let mut g = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    let mut mechanism = b"NULL".to_vec();
    mechanism.resize(20, 0);
    g.extend(mechanism);
    g.push(0); // as-server
    g.extend([0; 31]);
    assert_eq!(g.len(), 64);
    g
}

/// The 73-byte attack of issue 25: a valid greeting, then a command frame that declares
/// 2^62 bytes (long-size flag, size `0x4000000000000000`).
pub fn giant_frame_attack() -> Vec<u8> {
    let mut bytes = greeting();
    bytes.extend([0x06, 0x40, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(bytes.len(), 73);
    bytes
}

/// One frame: flags (MORE 0x01, LONG 0x02, COMMAND 0x04), size, body.
pub fn frame(body: &[u8], more: bool, command: bool) -> Vec<u8> {
    let mut flags = u8::from(more) | if command { 0x04 } else { 0 };
    let mut out = Vec::with_capacity(body.len() + 9);
    if body.len() > 255 {
        flags |= 0x02;
        out.push(flags);
        out.extend((body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
    out
}

/// The READY command announcing `socket_type` (NULL mechanism, no identity).
pub fn ready(socket_type: &str) -> Vec<u8> {
    let mut body = b"\x05READY".to_vec();
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend((socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    frame(&body, false, true)
}

/// A connected raw TCP peer.
pub struct RawPeer {
    pub stream: TcpStream,
}

impl RawPeer {
    /// Connects without saying anything.
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("TCP connect");
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Self { stream }
    }

    /// Connects and completes the NULL handshake as `socket_type`: sends greeting and READY,
    /// reads the server's greeting (its READY is skipped by [`Self::recv_message`]).
    pub fn handshake(addr: SocketAddr, socket_type: &str) -> Self {
        let mut peer = Self::connect(addr);
        peer.write(&greeting());
        let mut theirs = [0u8; 64];
        peer.stream.read_exact(&mut theirs).expect("server greeting");
        assert_eq!((theirs[0], theirs[9], theirs[10]), (0xff, 0x7f, 3), "a ZMTP 3 greeting");
        peer.write(&ready(socket_type));
        peer
    }

    /// Writes raw bytes (an error means the server closed us, which is fine for an attacker).
    pub fn write(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).and_then(|_| self.stream.flush()).is_ok()
    }

    /// Sends one multipart message.
    pub fn send(&mut self, frames: &[&[u8]]) -> bool {
        let mut bytes = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            bytes.extend(frame(f, i + 1 < frames.len(), false));
        }
        self.write(&bytes)
    }

    /// Sends a DEALER replay request from `start`: `[empty, start u64 BE]`.
    pub fn send_replay_request(&mut self, start: u64) -> bool {
        self.send(&[b"", &start.to_be_bytes()])
    }

    /// Reads the next message, skipping commands (READY, PING...).
    pub fn recv_message(&mut self) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        loop {
            let mut flags = [0u8; 1];
            self.stream.read_exact(&mut flags).expect("frame flags");
            let size = if flags[0] & 0x02 != 0 {
                let mut s = [0u8; 8];
                self.stream.read_exact(&mut s).expect("long size");
                u64::from_be_bytes(s)
            } else {
                let mut s = [0u8; 1];
                self.stream.read_exact(&mut s).expect("short size");
                u64::from(s[0])
            };
            assert!(size < 1 << 30, "implausible frame size {size}");
            let mut body = vec![0u8; size as usize];
            self.stream.read_exact(&mut body).expect("frame body");
            if flags[0] & 0x04 != 0 {
                continue;
            }
            frames.push(body);
            if flags[0] & 0x01 == 0 {
                return frames;
            }
        }
    }

    /// Reads one replay answer as a DEALER: `(seq, payload)` pairs until the end marker.
    /// Returns the sequence numbers received.
    pub fn recv_replay(&mut self) -> Vec<u64> {
        let mut seqs = Vec::new();
        loop {
            let m = self.recv_message();
            assert_eq!(m.len(), 3, "replay replies are [empty, seq, payload]");
            let seq = i64::from_be_bytes(m[1][..].try_into().expect("8-byte sequence"));
            if seq == -1 {
                return seqs;
            }
            seqs.push(seq as u64);
        }
    }
}
