//! A real `redis-server` for a test: started on a free port in a temporary directory, stopped
//! (and its directory removed) when dropped. `./scripts/test.sh` installs it when missing.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running `redis-server`.
pub struct Redis {
    child: Child,
    /// Its port.
    pub port: u16,
    dir: PathBuf,
}

impl Redis {
    /// Starts one on a free port.
    pub fn start(name: &str) -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Redis::start_on(name, port)
    }

    /// Starts one on `port`.
    pub fn start_on(name: &str, port: u16) -> Redis {
        let dir = std::env::temp_dir().join(format!("tollgate-redis-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (./scripts/test.sh installs it)");
        // Ready when it accepts connections (bounded: 5 s).
        for _ in 0..500 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Redis { child, port, dir };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server did not start on port {port}");
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
