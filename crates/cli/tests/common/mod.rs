//! What the integration tests share: the binary, starting a server, admin commands.

// Each test crate uses its own part of this module.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// The `tollgate` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// `tollgate server` on `data`, gRPC on `grpc`, HTTP on any free loopback port.
pub fn server_command(data: &Path, grpc: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["server", "--data", data.to_str().unwrap(), "--grpc", grpc, "--http", "127.0.0.1:0"]);
    cmd
}

/// Runs an admin command against the server at `url`, which must succeed.
pub fn admin(url: &str, args: &[&str]) {
    let out = Command::new(BIN).args(args).env("TOLLGATE_SERVER", url).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}
