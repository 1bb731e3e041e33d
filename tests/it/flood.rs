//! A flood from one over-limit subject: the local block cache answers it, so Redis sees
//! almost none of it, and everyone else is still decided by Redis.

use crate::support;

use std::time::Duration;

use deadpool_redis::redis;
use redlimit::{Limiter, Origin, Policy};
use support::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_subject_barely_reaches_redis() {
    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let limiter = Limiter::builder(server.store().timeout(Duration::from_secs(1)))
        .policy(Policy::sliding_window("api", 20, Duration::from_secs(60)).unwrap())
        .block_cache(10_000)
        .build()
        .unwrap();

    // Warm the connection and load the function library, then count from zero.
    limiter.check("warm-up", 1).await.unwrap();
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();

    const FLOOD: usize = 5_000;
    let mut admitted = 0;
    let mut from_cache = 0;
    for i in 0..FLOOD {
        let decision = limiter.check("flooder", 1).await.unwrap();
        admitted += usize::from(decision.is_allowed());
        from_cache += usize::from(decision.origin() == Origin::BlockCache);
        if i % 100 == 0 {
            // Someone else, in the middle of the flood: still decided by Redis.
            let other = limiter.check(format!("user-{i}"), 1).await.unwrap();
            assert!(other.is_allowed());
            assert_eq!(other.origin(), Origin::Store);
        }
    }
    assert_eq!(admitted, 20, "the limit holds");
    assert_eq!(
        from_cache,
        FLOOD - 21,
        "every request after the first denial is local"
    );

    let calls = support::command_calls(&mut conn).await;
    let fcall = calls.get("fcall").copied().unwrap_or(0);
    // 20 admitted + 1 denial for the flooder, 50 for the others.
    assert_eq!(fcall, 21 + 50, "{calls:?}");
    server.assert_every_key_expires().await;
}
