//! What ships beside the binary for running it: the systemd unit under `deploy/systemd/`,
//! checked by systemd's own analyzer and its command line run for real.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::{BIN, data_dir, eventually, free_port, http};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The unit as shipped, its `ExecStart` pointed at the binary under test.
fn unit_here(dir: &std::path::Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("deploy/systemd/tollgate.service")).unwrap();
    let path = dir.join("tollgate.service");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&path, text.replace("/usr/local/bin/tollgate", BIN)).unwrap();
    path
}

/// The value of `key` in the unit's `[Service]` section (the last, as systemd takes it).
fn service_value(text: &str, key: &str) -> Option<String> {
    let service = text.split("\n[Service]\n").nth(1)?.split("\n[").next()?;
    service.lines().rev().find_map(|l| l.strip_prefix(&format!("{key}="))).map(str::to_string)
}

#[test]
fn the_systemd_unit_verifies_and_is_sandboxed() {
    let dir = data_dir("systemd-unit");
    let unit = unit_here(&dir);
    let out =
        Command::new("systemd-analyze").arg("verify").arg(&unit).output().expect("systemd-analyze runs");
    let said = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    // Verify only warns of an unknown key: every word it says counts.
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify:\n{said}");
    let text = std::fs::read_to_string(&unit).unwrap();
    for (key, want) in [
        ("DynamicUser", "yes"),
        ("StateDirectory", "tollgate"),
        ("ProtectSystem", "strict"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("PrivateTmp", "yes"),
    ] {
        assert_eq!(service_value(&text, key).as_deref(), Some(want), "{key}");
    }
    // systemd's own measure of what the service is exposed to, from 0 (nothing) to 10.
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=20"])
        .arg(&unit)
        .output()
        .expect("systemd-analyze runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exposure above 2.0:\n{report}");
    let level = report.lines().find(|l| l.contains("Overall exposure level")).expect("a level");
    println!("{level}");
}

/// A unit with an unknown key or a missing binary is caught: the check above can fail.
#[test]
fn a_unit_with_a_typo_or_no_binary_is_caught() {
    let dir = data_dir("systemd-typo");
    let unit = unit_here(&dir);
    let text = std::fs::read_to_string(&unit).unwrap();
    for broken in [
        text.replace("ProtectSystem=strict", "ProtectSytem=strict"),
        text.replace(BIN, "/nonexistent/tollgate"),
    ] {
        std::fs::write(&unit, broken).unwrap();
        let out = Command::new("systemd-analyze").arg("verify").arg(&unit).output().unwrap();
        assert!(!out.status.success() || !out.stderr.is_empty(), "a broken unit passed");
    }
}

/// The unit's `ExecStart`, run as written (the state directory and ports made this test's
/// own), serves: the command line the unit gives is one the server takes.
#[test]
fn the_units_command_line_serves() {
    let text = std::fs::read_to_string(repo().join("deploy/systemd/tollgate.service")).unwrap();
    let exec = service_value(&text, "ExecStart").expect("ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/tollgate"));
    let data = data_dir("systemd-run");
    let args: Vec<String> = words
        .map(|w| match w {
            "/var/lib/tollgate" => data.to_str().unwrap().to_string(),
            w if w.starts_with("127.0.0.1:") => "127.0.0.1:0".to_string(),
            w => w.to_string(),
        })
        .collect();
    assert!(args.iter().any(|a| a == "--data"), "{exec}");
    assert_healthy(BIN.as_ref(), &args);
    assert!(data.join(tollgate_controller::store::FILE_NAME).exists(), "the store is in the state directory");
}

/// Runs `scripts/NAME` on the binary under test with the variable `env` set: what it printed,
/// and the version the binary says it is.
fn script(name: &str, env: (&str, &std::ffi::OsStr)) -> (String, String) {
    let out = Command::new(repo().join("scripts").join(name))
        .env("TOLLGATE_BIN", BIN)
        .env(env.0, env.1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    let version = run(BIN, &["--version"]).split_whitespace().nth(1).unwrap().to_string();
    (String::from_utf8(out.stdout).unwrap(), version)
}

/// The bytes a script's `LABEL: N bytes (M MB)` line gives, its MB the same figure rounded.
fn printed_size(said: &str, label: &str) -> u64 {
    let line = said.lines().find_map(|l| l.strip_prefix(&format!("{label}: "))).expect("the size line");
    let words: Vec<&str> = line.split_whitespace().collect();
    let bytes: u64 = words[0].parse().unwrap();
    assert_eq!(words[1..], ["bytes", &format!("({:.1}", bytes as f64 / 1e6), "MB)"], "{line}");
    bytes
}

/// Starts a server with `command` (its log dropped): the process, and the first line it printed
/// (where it listens).
fn spawn_server(command: &mut Command) -> (std::process::Child, String) {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    (child, line)
}

/// Starts `binary` with `args` (a server on loopback), asks its `/healthz` and stops it: the
/// answer must be `ok`.
fn assert_healthy(binary: &std::path::Path, args: &[impl AsRef<std::ffi::OsStr>]) {
    let (mut child, line) = spawn_server(Command::new(binary).args(args));
    let words: Vec<&str> = line.split_whitespace().collect();
    let (code, _, body) = http(words[6], "GET", "/healthz", &[], "");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!((code, body.trim()), (200, "ok"), "{line}");
}

/// Runs `program` with `args`, panicking with what it said when it fails; its standard output.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Every file under `root`, as paths inside it.
fn files_under(root: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                dirs.push(path);
            } else {
                found.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    found
}

/// A working container made from `image`, mounted: removed (and the image with it) on drop.
struct Mounted {
    container: String,
    image: String,
    root: PathBuf,
}

impl Mounted {
    fn new(image: &str) -> Mounted {
        let container = run("buildah", &["from", "--pull-never", image]).trim().to_string();
        let root = PathBuf::from(run("buildah", &["mount", &container]).trim());
        Mounted { container, image: image.to_string(), root }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        for args in [vec!["umount", &self.container], vec!["rm", &self.container], vec!["rmi", &self.image]] {
            let _ = Command::new("buildah").args(&args).output();
        }
    }
}

/// The image `scripts/image.sh` builds from `scratch` with buildah, as a user would get it:
/// its configuration (a user of its own, the data volume, the command), exactly the files the
/// binary needs, the size it prints, and its root file system run for real. Containers cannot be started here
/// (no cgroups, no rlimits), so the test runs the image's entrypoint and command in that root
/// file system under `chroot`, as the image's user, in a network namespace of its own (so
/// `0.0.0.0` is that namespace's alone), and reaches it there over TLS.
#[test]
fn the_image_builds_from_scratch_and_its_root_file_system_serves() {
    assert_eq!(
        run("id", &["-u"]).trim(),
        "0",
        "buildah's image store and chroot need root: run the tests as root (CI does)"
    );
    let name = format!("localhost/tollgate-test-{}", std::process::id());
    let (said, version) = script("image.sh", ("TOLLGATE_IMAGE", name.as_ref()));
    let reference = said.lines().last().unwrap().to_string();
    assert_eq!(reference, format!("{name}:{version}"), "the tag is the version the binary prints");
    let image = Mounted::new(&reference);

    let inspect: serde_json::Value =
        serde_json::from_str(&run("buildah", &["inspect", "--type", "image", &reference])).unwrap();
    let config = &inspect["OCIv1"]["config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert!(config["Volumes"].get("/var/lib/tollgate").is_some(), "{config}");
    assert_eq!(config["Labels"]["org.opencontainers.image.version"], version.as_str());
    let command: Vec<String> = [&config["Entrypoint"], &config["Cmd"]]
        .iter()
        .flat_map(|v| v.as_array().unwrap())
        .map(|w| w.as_str().unwrap().to_string())
        .collect();
    assert_eq!(command[..2], ["/usr/local/bin/tollgate", "server"]);
    for flag in ["--auth", "--tls-cert", "--tls-key", "0.0.0.0:7460", "0.0.0.0:7461"] {
        assert!(command.iter().any(|w| w == flag), "{flag} in {command:?}");
    }
    // The conventional Containerfile (for machines that can pull base images) asks for the same.
    let containerfile = std::fs::read_to_string(repo().join("Containerfile")).unwrap();
    let instruction = |word: &str| {
        containerfile.lines().rev().find_map(|l| l.strip_prefix(&format!("{word} "))).unwrap().to_string()
    };
    assert_eq!(instruction("USER"), config["User"].as_str().unwrap());
    assert_eq!(instruction("VOLUME"), "/var/lib/tollgate");
    assert_eq!(instruction("EXPOSE"), "7460/tcp 7461/tcp");
    let words = |word: &str| serde_json::from_str::<Vec<String>>(&instruction(word)).unwrap();
    assert_eq!([words("ENTRYPOINT"), words("CMD")].concat(), command, "the Containerfile's command");
    // The size the script prints is the image's: its layers, as its manifest lists them.
    let manifest: serde_json::Value = serde_json::from_str(inspect["Manifest"].as_str().unwrap()).unwrap();
    let layers: u64 =
        manifest["layers"].as_array().unwrap().iter().map(|l| l["size"].as_u64().unwrap()).sum();
    assert_eq!(printed_size(&said, "image size"), layers, "{said}");

    // Exactly what the binary needs: no shell, no package manager, nothing else.
    let root = &image.root;
    let files = files_under(root);
    let expected_prefixes = [
        "usr/local/bin/tollgate",
        "lib64/ld-linux-x86-64.so.2",
        "lib/x86_64-linux-gnu/lib",
        "etc/ssl/certs/ca-certificates.crt",
        "etc/nsswitch.conf",
        "etc/passwd",
        "etc/group",
    ];
    let stray: Vec<&String> =
        files.iter().filter(|f| !expected_prefixes.iter().any(|p| f.starts_with(p))).collect();
    assert!(stray.is_empty(), "files the binary does not need: {stray:?}");
    assert!(files.iter().any(|f| f.ends_with("/libnss_files.so.2")), "{files:?}");
    assert!(!root.join("bin/sh").exists());

    // The TLS secret a pod mounts, readable by the image's user.
    let pki = tollgate_testkit::pki::Pki::new(&data_dir("image-pki"), "image-ca");
    let (cert, key) = pki.issue("localhost", "server", false);
    let tls = root.join("etc/tollgate/tls");
    std::fs::copy(&cert, tls.join("tls.crt")).unwrap();
    std::fs::copy(&key, tls.join("tls.key")).unwrap();
    std::os::unix::fs::chown(tls.join("tls.key"), Some(65532), Some(65532)).unwrap();

    // The image's environment alone, as a runtime gives it.
    let env: Vec<&str> = config["Env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let script = format!(
        "ip link set lo up && exec env -i {} \"$(command -v chroot)\" --userspec=65532:65532 {} {}",
        env.join(" "),
        root.display(),
        command.join(" ")
    );
    let (mut child, line) = spawn_server(Command::new("unshare").args(["--net", "--", "sh", "-c", &script]));
    let net = format!("--net=/proc/{}/ns/net", child.id());
    let ca = pki.ca_file();
    let curl = |path: &str, token: Option<&str>| {
        let url = format!("https://localhost:7461{path}");
        let auth = format!("authorization: Bearer {}", token.unwrap_or(""));
        let mut args = vec![net.as_str(), "curl", "-sS", "--cacert", ca.to_str().unwrap(), &url];
        if token.is_some() {
            args.extend(["-H", &auth]);
        }
        let out = Command::new("nsenter").args(&args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    let health = curl("/healthz", None);
    // The first admin token is written to the data volume, owned by the image's user.
    let token_file = root.join("var/lib/tollgate/admin.token");
    let token = std::fs::read_to_string(&token_file).unwrap_or_default();
    let owner = std::fs::metadata(&token_file).map_or(0, |m| std::os::unix::fs::MetadataExt::uid(&m));
    let created = Command::new("nsenter")
        .args([&net, BIN, "group", "create", "image-made", "--limit", "50"])
        .args(["--server", "https://localhost:7460", "--ca", ca.to_str().unwrap()])
        .env("TOLLGATE_TOKEN", token.trim())
        .output()
        .unwrap();
    let groups = curl("/v1/groups", Some(token.trim()));
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("grpc 0.0.0.0:7460 http 0.0.0.0:7461 data /var/lib/tollgate"), "{line}");
    assert_eq!(health.trim(), "ok");
    assert_eq!(owner, 65532, "the store belongs to the image's user");
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    assert!(groups.contains("\"image-made\""), "{groups}");
    assert!(root.join("var/lib/tollgate").join(tollgate_controller::store::FILE_NAME).exists());
}

/// The release archive `scripts/release.sh` packs: its sum checks, it holds the binary, the
/// licence, the README, the changelog, every guide under `docs/` the README links to and
/// `deploy/`, the sizes it prints are the files', the binary it holds says the version the
/// archive is named for and serves, and the oldest glibc it needs is the one the docs state.
#[test]
fn the_release_archive_unpacks_checks_and_serves() {
    let dist = data_dir("release-dist");
    let (said, version) = script("release.sh", ("TOLLGATE_DIST", dist.as_os_str()));
    let archive = PathBuf::from(said.lines().last().unwrap());
    let name = format!("tollgate-{version}-x86_64-linux");
    assert_eq!(archive, dist.join(format!("{name}.tar.gz")));
    let sum = Command::new("sha256sum")
        .args(["--check", &format!("{name}.tar.gz.sha256")])
        .current_dir(&dist)
        .output()
        .unwrap();
    assert!(sum.status.success(), "{}", String::from_utf8_lossy(&sum.stdout));

    let unpacked = data_dir("release-unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    run("tar", &["-xzf", archive.to_str().unwrap(), "-C", unpacked.to_str().unwrap()]);
    let top = unpacked.join(&name);
    for file in ["tollgate", "LICENSE", "README.md", "CHANGELOG.md", "deploy/systemd/tollgate.service"] {
        assert!(top.join(file).is_file(), "{file} in the archive");
    }
    // The guides the README links to travel with it.
    let readme = std::fs::read_to_string(top.join("README.md")).unwrap();
    let linked: Vec<&str> = readme.split("](").filter_map(|s| s.split(')').next()).collect();
    let guides: Vec<&&str> = linked.iter().filter(|l| l.starts_with("docs/")).collect();
    assert!(!guides.is_empty(), "the README links to docs/");
    for guide in guides {
        let file = guide.split('#').next().unwrap();
        assert!(top.join(file).is_file(), "{file}, which the README links to, in the archive");
    }
    // The sizes it prints are the files'.
    let bytes = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    assert_eq!(printed_size(&said, "archive size"), bytes(&archive), "{said}");
    assert_eq!(printed_size(&said, "binary size"), bytes(&top.join("tollgate")), "{said}");
    let binary = top.join("tollgate");
    assert_eq!(run(binary.to_str().unwrap(), &["--version"]).trim(), format!("tollgate {version}"));
    let data = data_dir("release-run");
    let data = data.to_str().unwrap();
    assert_healthy(&binary, &["server", "--data", data, "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"]);

    let glibc = said.lines().find_map(|l| l.strip_prefix("oldest glibc: ")).expect("the glibc line");
    let docs = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    assert!(docs.contains(&format!("glibc {glibc} or newer")), "docs/deploy.md states glibc {glibc}");
    assert!(docs.contains(&format!("{name}.tar.gz")), "docs/deploy.md names the archive of this version");
    assert!(
        docs.contains(&format!("localhost/tollgate:{version}")),
        "docs/deploy.md names the image of this version"
    );
}

/// The Kubernetes schema validator (PyPI's `kubernetes-validate`, which bundles the schemas):
/// `TOLLGATE_KUBERNETES_VALIDATE`, as `scripts/test.sh` installs it, or one on the `PATH`.
fn kubernetes_validate() -> PathBuf {
    std::env::var_os("TOLLGATE_KUBERNETES_VALIDATE")
        .map_or_else(|| PathBuf::from("kubernetes-validate"), PathBuf::from)
}

/// A manifest file's documents, as JSON (read by the Python beside the validator, whose YAML
/// reader it ships with).
fn manifest(file: &str) -> Vec<serde_json::Value> {
    let python = kubernetes_validate().with_file_name("python3");
    let path = repo().join("deploy/kubernetes").join(file);
    let json = run(
        python.to_str().unwrap(),
        &[
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
            path.to_str().unwrap(),
        ],
    );
    serde_json::from_str(&json).unwrap()
}

const MANIFESTS: [&str; 3] = ["single.yaml", "cluster.yaml", "etcd.yaml"];

/// The manifests under `deploy/kubernetes/` pass the Kubernetes schemas strictly (no unknown
/// field), a misspelt field is caught, and each controller has what the docs promise: probes
/// on `/healthz` and `/readyz`, resource requests, a non-root security context, a Service, a
/// PodDisruptionBudget and its settings in a ConfigMap.
#[test]
fn the_kubernetes_manifests_pass_the_schemas() {
    let dir = repo().join("deploy/kubernetes");
    let files: Vec<String> = MANIFESTS.iter().map(|f| dir.join(f).display().to_string()).collect();
    let mut args = vec!["--strict"];
    args.extend(files.iter().map(String::as_str));
    let said = run(kubernetes_validate().to_str().unwrap(), &args);
    assert!(!said.contains("ERROR"), "{said}");
    let broken = data_dir("kubernetes-broken");
    std::fs::create_dir_all(&broken).unwrap();
    let text = std::fs::read_to_string(dir.join("single.yaml")).unwrap();
    let typo = broken.join("single.yaml");
    std::fs::write(&typo, text.replace("readinessProbe:", "readynessProbe:")).unwrap();
    let out =
        Command::new(kubernetes_validate()).args(["--strict", typo.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success(), "a misspelt field passed");

    for file in ["single.yaml", "cluster.yaml"] {
        let docs = manifest(file);
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        for kind in ["ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget"] {
            assert!(kinds.contains(&kind), "{file}: a {kind}");
        }
        let set = docs.iter().find(|d| d["kind"] == "StatefulSet").unwrap();
        let pod = &set["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{file}");
        assert_eq!(pod["securityContext"]["runAsUser"], 65532, "{file}");
        let c = &pod["containers"][0];
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz", "{file}");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{file}");
        assert!(
            c["resources"]["requests"]["cpu"].is_string() && c["resources"]["requests"]["memory"].is_string()
        );
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{file}");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{file}");
    }
    let replicas = |file: &str| {
        manifest(file).iter().find(|d| d["kind"] == "StatefulSet").unwrap()["spec"]["replicas"].clone()
    };
    assert_eq!((replicas("single.yaml"), replicas("cluster.yaml")), (1.into(), 3.into()));
}

/// What a controller's pod would run: the manifest's container arguments, with the pod's
/// files (its ConfigMap, the TLS and admin-token secrets) made in `dir` and the paths and
/// addresses made this test's: `/etc/tollgate/…` and `/var/lib/tollgate` under `dir`,
/// `0.0.0.0:7460`/`:7461` the given loopback ports, `$(POD_NAME)` the pod's name and
/// `--etcd` the test's members.
struct Pod {
    args: Vec<String>,
    ca: PathBuf,
    token: String,
}

impl Pod {
    fn new(
        file: &str,
        dir: &std::path::Path,
        name: &str,
        ports: (u16, u16),
        etcd: &str,
        pki: &tollgate_testkit::pki::Pki,
    ) -> Pod {
        let docs = manifest(file);
        let config = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
        let set = docs.iter().find(|d| d["kind"] == "StatefulSet").unwrap();
        let container = &set["spec"]["template"]["spec"]["containers"][0];
        let etc = dir.join("etc");
        std::fs::create_dir_all(etc.join("config")).unwrap();
        std::fs::create_dir_all(etc.join("admin")).unwrap();
        for (key, value) in config["data"].as_object().unwrap() {
            std::fs::write(etc.join("config").join(key), value.as_str().unwrap()).unwrap();
        }
        let token = format!("tg_{}_{}", "00112233445566ff", "c0".repeat(32));
        std::fs::write(etc.join("admin/token"), &token).unwrap();
        // One authority for every pod of a test, as the secret holds one for all controllers.
        std::fs::create_dir_all(etc.join("tls")).unwrap();
        let (cert, key) = pki.issue("localhost", &format!("issued-{name}"), false);
        std::fs::rename(cert, etc.join("tls/tls.crt")).unwrap();
        std::fs::rename(key, etc.join("tls/tls.key")).unwrap();
        std::fs::copy(pki.ca_file(), etc.join("tls/ca.crt")).unwrap();
        let args = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let a = a.as_str().unwrap();
                if a.starts_with("--etcd=") {
                    return format!("--etcd={etcd}");
                }
                a.replace("/etc/tollgate", etc.to_str().unwrap())
                    .replace("/var/lib/tollgate", dir.join("data").to_str().unwrap())
                    .replace("0.0.0.0:7460", &format!("127.0.0.1:{}", ports.0))
                    .replace("0.0.0.0:7461", &format!("127.0.0.1:{}", ports.1))
                    .replace(
                        "$(POD_NAME).tollgate-peers.$(POD_NAMESPACE).svc:7460",
                        &format!("localhost:{}", ports.0),
                    )
                    .replace("$(POD_NAME)", name)
            })
            .collect();
        Pod { args, ca: pki.ca_file(), token }
    }

    fn start(&self) -> std::process::Child {
        let (child, line) = spawn_server(Command::new(BIN).arg("server").args(&self.args));
        assert!(line.contains("listening"), "{:?}: {line}", self.args);
        child
    }

    /// `GET path` over HTTPS on `port`, as a probe would: (status, body).
    fn get(&self, port: u16, path: &str, token: bool) -> (u16, String) {
        let auth = format!("authorization: Bearer {}", self.token);
        let url = format!("https://localhost:{port}{path}");
        let mut args = vec!["-sS", "--cacert", self.ca.to_str().unwrap(), "-w", "\n%{http_code}", &url];
        if token {
            args.extend(["-H", &auth]);
        }
        let out = run("curl", &args);
        let (body, code) = out.rsplit_once('\n').unwrap();
        (code.parse().unwrap(), body.to_string())
    }
}

/// `single.yaml`'s controller, run with its pod's arguments and files: live at once, ready
/// once its learning lease is over, serving the ConfigMap's groups to the secret's admin token.
#[test]
fn the_single_controller_manifest_runs_as_written() {
    let dir = data_dir("kubernetes-single");
    let ports = (free_port(), free_port());
    let pki = tollgate_testkit::pki::Pki::new(&dir.join("pki"), "pod-ca");
    let pod = Pod::new("single.yaml", &dir, "tollgate-0", ports, "", &pki);
    let mut child = pod.start();
    let health = pod.get(ports.1, "/healthz", false);
    let mut ready = (0, String::new());
    eventually("/readyz", || {
        ready = pod.get(ports.1, "/readyz", false);
        ready.0 == 200
    });
    let groups = pod.get(ports.1, "/v1/groups", true);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(health, (200, "ok\n".to_string()));
    assert_eq!(ready, (200, "ready\n".to_string()));
    assert!(groups.0 == 200 && groups.1.contains("\"default\""), "{groups:?}");
}

/// `cluster.yaml`'s three controllers, run with their pods' arguments on a real etcd: each
/// becomes ready (one leads, the others follow it), and each serves the settings the
/// ConfigMap wrote to etcd.
#[cfg(feature = "etcd")]
#[test]
fn the_three_controller_manifest_runs_as_written_on_etcd() {
    let etcd = tollgate_testkit::etcd::Etcd::start("kubernetes-cluster");
    let pki = tollgate_testkit::pki::Pki::new(&data_dir("kubernetes-cluster-pki"), "pod-ca");
    let pods: Vec<(Pod, (u16, u16))> = (0..3)
        .map(|i| {
            let ports = (free_port(), free_port());
            let dir = data_dir(&format!("kubernetes-cluster-{i}"));
            (Pod::new("cluster.yaml", &dir, &format!("tollgate-{i}"), ports, &etcd.url(), &pki), ports)
        })
        .collect();
    let mut children: Vec<std::process::Child> = pods.iter().map(|(p, _)| p.start()).collect();
    let mut said = Vec::new();
    eventually("three ready controllers", || {
        said = pods.iter().map(|(p, ports)| p.get(ports.1, "/readyz", false)).collect();
        said.iter().all(|(code, _)| *code == 200)
    });
    let groups: Vec<(u16, String)> =
        pods.iter().map(|(p, ports)| p.get(ports.1, "/v1/groups", true)).collect();
    let roles: Vec<String> = pods
        .iter()
        .map(|(p, ports)| {
            let (_, status) = p.get(ports.1, "/status?limit=1", true);
            let v: serde_json::Value = serde_json::from_str(&status).unwrap();
            v["role"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    for (code, body) in &groups {
        assert!(*code == 200 && body.contains("\"default\""), "{code} {body}");
    }
    let mut sorted = roles.clone();
    sorted.sort();
    assert_eq!(sorted, ["follower", "follower", "leader"], "{roles:?}");
}
