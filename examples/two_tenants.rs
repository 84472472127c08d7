//! Two tenants share one node through an embedded Tollgate limiter.
//!
//! The node sustains 1000 units/s. Tenant `a` reserves 600, tenant `b` reserves 200; both
//! are hungry (four tasks each, asking as fast as they are let in). Each gets its
//! reservation, and the free 200 units/s are split evenly: about 700 and 300 units/s.
//!
//! ```text
//! cargo run --release -p tollgate-limiter --example two_tenants [SECONDS]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate_limiter::{AcquireError, Tollgate};

const SETTINGS: &str = r#"
[node]
capacity = 1000        # units/s the backend sustains
max_wait_ms = 1000

[groups.a]
reserved = 600

[groups.b]
reserved = 200
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = match std::env::args().nth(1) {
        Some(arg) => arg.parse().map_err(|_| format!("SECONDS must be a whole number, got {arg:?}"))?,
        None => 5,
    };
    let gate = Tollgate::from_toml(SETTINGS)?;
    println!("capacity 1000 units/s; a reserves 600, b reserves 200; running {seconds} s");

    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for tenant in ["a", "b"] {
        for _ in 0..4 {
            let handle = gate.group(tenant)?;
            let stop = stop.clone();
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match handle.acquire(1.0).await {
                        Ok(_permit) => {} // the request would run here
                        Err(AcquireError::Throttled { retry_after, .. }) => {
                            tokio::time::sleep(retry_after).await
                        }
                        Err(other) => panic!("{other}"),
                    }
                }
            }));
        }
    }

    let mut last = [0.0f64; 2];
    let mut first_second = [0.0f64; 2];
    for second in 1..=seconds {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = [gate.stats("a").unwrap().admitted_units, gate.stats("b").unwrap().admitted_units];
        println!(
            "second {second:>2}: a {:>5.0} units/s   b {:>5.0} units/s",
            now[0] - last[0],
            now[1] - last[1]
        );
        if second == 1 {
            first_second = now;
        }
        last = now;
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await?;
    }
    if seconds > 1 {
        let steady = (seconds - 1) as f64;
        println!(
            "after the first second: a {:.0} units/s, b {:.0} units/s (expected about 700 and 300)",
            (last[0] - first_second[0]) / steady,
            (last[1] - first_second[1]) / steady
        );
    }
    Ok(())
}
