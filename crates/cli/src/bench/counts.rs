//! `tollgate bench accuracy`'s quota part: how much of a quota remote clients admit when they
//! ask for it once, twice and ten times over, beside the count envoy/ratelimit keeps (a Redis
//! counter per request, which admits exactly the quota at the cost of a round trip to Redis
//! per request).

use anyhow::Context;
use tollgate_proto::v1;

use crate::bench::load::{offer, open_loop, own_cpu};
use crate::say;

/// How often over its quota each run asks.
pub(crate) const DEMANDS: [u32; 3] = [1, 2, 10];
/// The groups it makes, one a run, and drops when it is done.
pub(crate) const GROUPS: [&str; 3] = ["quota-1x", "quota-2x", "quota-10x"];
/// The seconds each run asks for its quota over.
const SECONDS: f64 = 10.0;

/// For each demand, a group whose budget is `units`, asked `DEMANDS[i]` times that over
/// [`SECONDS`] by `gates`; then the same through a Redis counter at `redis`, if given.
pub(crate) async fn measure(
    admin: &mut crate::admin::Admin,
    gates: &[tollgate_limiter::Tollgate],
    units: f64,
    redis: Option<&str>,
) -> anyhow::Result<()> {
    for (k, group) in DEMANDS.into_iter().zip(GROUPS) {
        let patch = v1::GroupPatch { unlimited: true, budget: Some(units), ..Default::default() };
        let put =
            v1::PutGroupRequest { name: group.into(), patch: Some(patch), mode: v1::PutMode::Upsert as i32 };
        admin.put_group(put).await.map_err(|s| anyhow::anyhow!("{}", s.message()))?;
        let per_client = f64::from(k) * units / SECONDS / gates.len() as f64;
        let (rate, attempts) = offer(gates, group, per_client, 0.0, SECONDS).await;
        let admitted = rate * SECONDS;
        say(format!(
            "tollgate: a budget of {units} asked {k}× ({attempts} requests from {} clients): admitted {admitted:.0} = {:.2} % of it",
            gates.len(),
            admitted / units * 100.0
        ));
    }
    let Some(url) = redis else { return Ok(()) };
    let client = redis::Client::open(url).with_context(|| format!("--redis: invalid URL {url:?}"))?;
    for k in DEMANDS {
        let key = format!("tollgate-bench:quota-{k}x");
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("--redis: cannot reach {url}"))?;
        redis::cmd("DEL").arg(&key).query_async::<()>(&mut con).await?;
        let quota = units as i64;
        let clients: Vec<_> = (0..gates.len())
            .map(|_| {
                let (con, key) = (con.clone(), key.clone());
                move || {
                    let (mut con, key) = (con.clone(), key.clone());
                    async move {
                        let n: redis::RedisResult<i64> =
                            redis::cmd("INCR").arg(&key).query_async(&mut con).await;
                        matches!(n, Ok(n) if n <= quota)
                    }
                }
            })
            .collect();
        let per_client = f64::from(k) * units / SECONDS / gates.len() as f64;
        let cpu0 = own_cpu();
        let (rate, attempts) = open_loop(clients, per_client, 0.0, SECONDS).await;
        let cpu = (own_cpu() - cpu0).max(1e-3);
        say(format!(
            "redis INCR per request, a count of {units} asked {k}×: admitted {:.0} = {:.2} % of it ({:.0} decisions per CPU-second of the load process)",
            rate * SECONDS,
            rate * SECONDS / units * 100.0,
            attempts as f64 / cpu
        ));
    }
    Ok(())
}
