//! Test harnesses shared by Tollgate's crates (a dev-dependency only).
//!
//! - [`alloc`]: a counting global allocator, for benchmarks that report memory;
//! - [`cut`]: a TCP relay a test can cut, to partition one client from a service;
//! - [`net`]: a real controller (`tollgate_controller::serve`) on turmoil's simulated network, in
//!   simulated time, with the controller crashed, restarted or cut off on command;
//! - [`redis`]: a real `redis-server` on a free loopback port, plain or TLS;
//! - [`etcd`]: a real etcd member or cluster;
//! - [`pki`]: certificates made inside a test;
//! - [`port`]: free loopback ports outside the kernel's ephemeral range.

pub mod alloc;
pub mod cut;
pub mod etcd;
pub mod net;
pub mod pki;
pub mod port;
pub mod redis;
