//! Real `etcd` members for a test: started on free loopback ports in a temporary directory,
//! stopped (and their directories removed) when dropped. `./scripts/test.sh` installs Debian's
//! `etcd-server` when it is missing.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::port::free_port;

/// One running `etcd` member.
pub struct Etcd {
    child: Option<Child>,
    /// Its client port.
    pub port: u16,
    dir: PathBuf,
    /// How it was started, to start it again on the same data.
    args: Vec<std::ffi::OsString>,
}

impl Etcd {
    /// Starts a one-member cluster on free ports.
    pub fn start(name: &str) -> Etcd {
        Etcd::cluster(name, 1).remove(0)
    }

    /// Starts a cluster of `members` on free ports, and waits until each answers healthy
    /// (which needs a quorum).
    pub fn cluster(name: &str, members: usize) -> Vec<Etcd> {
        let ports: Vec<(u16, u16)> = (0..members).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let started: Vec<Etcd> = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| {
                let dir =
                    std::env::temp_dir().join(format!("tollgate-etcd-{name}-{i}-{}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).unwrap();
                let peer_url = format!("http://127.0.0.1:{peer}");
                let client_url = format!("http://127.0.0.1:{client}");
                let data = dir.join("data");
                let args: Vec<std::ffi::OsString> = [
                    "--name",
                    &format!("m{i}"),
                    "--data-dir",
                    data.to_str().unwrap(),
                    "--listen-client-urls",
                    &client_url,
                    "--advertise-client-urls",
                    &client_url,
                    "--listen-peer-urls",
                    &peer_url,
                    "--initial-advertise-peer-urls",
                    &peer_url,
                    "--initial-cluster",
                    &initial,
                    "--initial-cluster-state",
                    "new",
                    "--log-level",
                    "error",
                ]
                .iter()
                .map(Into::into)
                .collect();
                let mut e = Etcd { child: None, port: client, dir, args };
                e.spawn();
                e
            })
            .collect();
        for e in &started {
            e.wait_ready();
        }
        started
    }

    /// The client URLs of `members`, comma-separated (as `--etcd` takes them).
    pub fn urls(members: &[Etcd]) -> String {
        members.iter().map(Etcd::url).collect::<Vec<_>>().join(",")
    }

    /// Ready when it accepts connections and answers its health endpoint (bounded: 20 s).
    fn wait_ready(&self) {
        for _ in 0..2000 {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
                let mut out = String::new();
                if s.write_all(req.as_bytes()).is_ok()
                    && s.read_to_string(&mut out).is_ok()
                    && out.contains("\"health\":\"true\"")
                {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("etcd did not start on port {}: see {}", self.port, self.dir.join("etcd.log").display());
    }

    /// Its client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd is installed (./scripts/test.sh installs Debian's etcd-server)");
        self.child = Some(child);
    }

    /// Starts it again after [`kill`](Self::kill), on the same ports and data, and waits until
    /// it answers healthy.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.spawn();
        self.wait_ready();
    }

    /// Kills it (kill -9); its directory stays until dropped.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
