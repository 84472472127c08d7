//! A real `redis-server` for a test: started on a free port in a temporary directory, stopped
//! (and its directory removed) when dropped. `./scripts/test.sh` installs it when missing.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `redis-server`.
pub struct Redis {
    child: Child,
    /// Its port.
    pub port: u16,
    dir: PathBuf,
    tls: bool,
}

/// The files a TLS `redis-server` is started with.
pub struct RedisTls<'a> {
    /// Its certificate and key.
    pub cert: &'a Path,
    /// Its key.
    pub key: &'a Path,
    /// The authority for client certificates.
    pub ca: &'a Path,
    /// Whether clients must show a certificate (`tls-auth-clients`).
    pub client_certificates: bool,
}

impl Redis {
    /// Starts one on a free port.
    pub fn start(name: &str) -> Redis {
        let port = crate::port::free_port();
        Redis::start_on(name, port)
    }

    /// Starts one on `port`.
    pub fn start_on(name: &str, port: u16) -> Redis {
        Redis::launch(name, port, None)
    }

    /// Starts one speaking only TLS on a free port (its URL is `rediss://`).
    pub fn start_tls(name: &str, tls: RedisTls<'_>) -> Redis {
        let port = crate::port::free_port();
        Redis::launch(name, port, Some(tls))
    }

    fn launch(name: &str, port: u16, tls: Option<RedisTls<'_>>) -> Redis {
        let dir = std::env::temp_dir().join(format!("tollgate-redis-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("redis-server");
        match &tls {
            None => cmd.args(["--port", &port.to_string()]),
            Some(t) => cmd
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(t.cert)
                .arg("--tls-key-file")
                .arg(t.key)
                .arg("--tls-ca-cert-file")
                .arg(t.ca)
                .args(["--tls-auth-clients", if t.client_certificates { "yes" } else { "no" }]),
        };
        let mut child = cmd
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (./scripts/test.sh installs it)");
        // Ready when it accepts connections (bounded: 5 s).
        for _ in 0..500 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Redis { child, port, dir, tls: tls.is_some() };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not start on port {port}");
    }

    /// Its URL.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
