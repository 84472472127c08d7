//! A TCP relay on a free loopback port that a test can cut: every connection through it is
//! shut at once and new ones are dropped as they come, until it is healed. Put in front of a
//! service (etcd, say) for one client only, it cuts that client off while the others still
//! reach the service: a partition, without a network namespace.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A relay to one address. See the [module documentation](self).
pub struct Cuttable {
    /// The loopback port it listens on.
    pub port: u16,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Cuttable {
    /// Relays connections to `target` (`HOST:PORT`) from a free loopback port.
    pub fn start(target: &str) -> Cuttable {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (flag, streams, target) = (cut.clone(), open.clone(), target.to_string());
        std::thread::spawn(move || {
            for incoming in listener.incoming() {
                let Ok(inbound) = incoming else { continue };
                if flag.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(&target) else { continue };
                let mut held = streams.lock().unwrap_or_else(PoisonError::into_inner);
                for s in [&inbound, &outbound] {
                    if let Ok(clone) = s.try_clone() {
                        held.push(clone);
                    }
                }
                drop(held);
                relay(&inbound, &outbound);
                relay(&outbound, &inbound);
            }
        });
        Cuttable { port, cut, open }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Shuts every connection through it, and drops new ones until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` on a thread of its own until either side closes.
fn relay(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else { return };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
