//! Compiles the contract with protox (pure Rust: no `protoc` needed) and generates the
//! message types and the tonic clients and servers.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/tollgate/v1/tollgate.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
