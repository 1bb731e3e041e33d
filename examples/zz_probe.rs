use redlimit::{Limiter, Policy, RedisStore};
use std::time::Duration;
#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .init();
    let mut child = std::process::Command::new("redis-server")
        .args(["--port", "7999", "--save", ""])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pool = redlimit::deadpool_redis::Config::from_url("redis://127.0.0.1:7999/")
        .create_pool(Some(redlimit::deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let store = RedisStore::new(pool).timeout(Duration::from_millis(200));
    let limiter = Limiter::new(
        store.clone(),
        Policy::fixed_window("a", 5, Duration::from_secs(1)).unwrap(),
    );
    println!("{:?}", limiter.check("x", 1).await.map(|d| d.remaining()));
    child.kill().unwrap();
    child.wait().unwrap();
    for _ in 0..10 {
        println!("{:?}", limiter.check("x", 1).await.map(|d| d.remaining()));
        println!("{store:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
