//! The tonic example's server, on a free port, driven by real tonic clients: tonic-health's
//! generated `HealthClient` and the example's hand-written greeter client.

use std::time::Duration;

use redlimit::clock::FakeClock;
use redlimit::MemoryStore;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[path = "../../examples/tonic.rs"]
#[allow(dead_code)] // the example's `main`
mod example;

use example::greeter;

/// The example's server on a free loopback port, its limiter on `clock`; stops on drop.
struct Running {
    channel: Channel,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl Running {
    async fn start(clock: &FakeClock) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let store = MemoryStore::with_clock(clock.clone());
        let server = tokio::spawn(example::serve(listener, store, async {
            let _ = stopped.await;
        }));
        // The listener is bound already: the connection waits in its backlog.
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self {
            channel,
            stop: Some(stop),
            server: Some(server),
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(server) = &self.server {
            server.abort();
        }
    }
}

fn pushback_ms(status: &tonic::Status) -> u64 {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .expect("a denial carries grpc-retry-pushback-ms")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn check() -> HealthCheckRequest {
    HealthCheckRequest {
        service: String::new(),
    }
}

#[tokio::test]
async fn five_health_checks_then_resource_exhausted_with_the_pushback() {
    let clock = FakeClock::new(0);
    let running = Running::start(&clock).await;
    let mut health = HealthClient::new(running.channel.clone());

    for _ in 0..5 {
        let reply = health.check(check()).await.unwrap();
        assert_eq!(reply.get_ref().status(), ServingStatus::Serving);
        // Allowed calls carry the RateLimit headers too.
        assert!(reply.metadata().get("ratelimit").is_some());
    }
    let denied = health.check(check()).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    assert_eq!(
        denied.message(),
        format!(
            "rate limit 'per-peer' exceeded; retry after {} ms",
            pushback_ms(&denied)
        )
    );
    // The sliding window weighs the previous window's 5 calls until they have faded
    // enough (here 12 s), so the wait may pass one window but never two.
    let wait = pushback_ms(&denied);
    assert!(wait > 0 && wait <= 20_000, "{wait}");
    assert_eq!(
        denied.metadata().get("ratelimit-policy").unwrap(),
        r#""per-peer";q=5;w=10"#
    );

    // One millisecond early is still too early; at the pushback the call passes.
    clock.advance(Duration::from_millis(wait - 1));
    let early = health.check(check()).await.unwrap_err();
    assert_eq!(early.code(), Code::ResourceExhausted);
    assert_eq!(pushback_ms(&early), 1);
    clock.advance(Duration::from_millis(1));
    health.check(check()).await.unwrap();

    running.stop().await;
}

#[tokio::test]
async fn the_greeter_shares_the_limit_and_sees_the_decision() {
    let clock = FakeClock::new(0);
    let running = Running::start(&clock).await;

    for left in (0..5).rev() {
        let reply = greeter::say_hello(running.channel.clone(), "ada")
            .await
            .unwrap();
        assert_eq!(
            reply.message,
            format!("hello, ada; {left} calls left in this window")
        );
    }
    let denied = greeter::say_hello(running.channel.clone(), "ada")
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted);
    assert!(pushback_ms(&denied) > 0);

    // The health service counts against the same per-peer limit.
    let mut health = HealthClient::new(running.channel.clone());
    let denied = health.check(check()).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted);

    running.stop().await;
}

#[tokio::test]
async fn an_unknown_greeter_method_is_unimplemented() {
    let clock = FakeClock::new(0);
    let running = Running::start(&clock).await;
    let mut grpc = tonic::client::Grpc::new(running.channel.clone());
    grpc.ready().await.unwrap();
    let status = grpc
        .unary::<_, greeter::HelloReply, _>(
            tonic::Request::new(greeter::HelloRequest {
                name: "x".to_owned(),
            }),
            http::uri::PathAndQuery::from_static("/redlimit.example.Greeter/Missing"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    running.stop().await;
}
