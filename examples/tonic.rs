//! A tonic gRPC server limited per peer IP to 5 calls per 10 seconds.
//!
//! ```text
//! cargo run --example tonic            # 127.0.0.1:50051; PORT=50052 to move it
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check   # 6 times
//! # without grpcurl: an empty HealthCheckRequest in gRPC framing, headers shown
//! printf '\0\0\0\0\0' | curl -s --http2-prior-knowledge -H 'content-type: application/grpc' \
//!     -H 'te: trailers' --data-binary @- -D - -o /dev/null \
//!     http://127.0.0.1:50051/grpc.health.v1.Health/Check
//! ```
//!
//! It serves the standard health service (`grpc.health.v1.Health`, from tonic-health)
//! and a small service of its own, `redlimit.example.Greeter/SayHello`, written by hand
//! on tonic's generic server so no `protoc` is needed. Both share one limit: the sixth
//! call within the window gets `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`, in a
//! trailers-only response the limiter writes without calling the service.
//!
//! tests/it/grpc.rs runs [`serve`] on a free port with a fake clock and a real tonic client.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use redlimit::key::ClientIp;
use redlimit::{Limiter, MemoryStore, Policy, RateLimitLayer};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

/// The limit of every call, per peer IP: 5 per 10 seconds, weighted over the previous
/// window so a burst at a window's edge does not get 10.
pub fn policy() -> Policy {
    Policy::sliding_window("per-peer", 5, Duration::from_secs(10))
        .expect("5 per 10 s is a valid policy")
}

/// Serves the health service and the greeter on `listener` until `shutdown`, every call
/// limited per peer IP by [`policy`], the counts kept in `store`.
pub async fn serve(
    listener: TcpListener,
    store: MemoryStore,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    // The peer address comes from tonic's `TcpConnectInfo`; no proxy is trusted.
    let limit = RateLimitLayer::new(Limiter::new(store, policy()), ClientIp::new());
    Server::builder()
        .layer(limit)
        .add_service(health)
        .add_service(greeter::GreeterServer)
        .serve_with_incoming_shutdown(TcpIncoming::from(listener), shutdown)
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port.parse()?,
        Err(_) => 50051,
    };
    let listener = TcpListener::bind(("127.0.0.1", port)).await?;
    let policy = policy();
    println!(
        "gRPC on {}: grpc.health.v1.Health and {}, limited per peer IP to {} calls per {} s \
         ({:?}); over the limit: RESOURCE_EXHAUSTED with grpc-retry-pushback-ms",
        listener.local_addr()?,
        greeter::SERVICE,
        policy.limit(),
        policy.window().as_secs(),
        policy.algorithm(),
    );
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    serve(listener, MemoryStore::new(), ctrl_c).await?;
    Ok(())
}

/// `redlimit.example.Greeter`: one unary method, its messages written by hand with
/// prost's derive and served with tonic's generic `Grpc` (what generated code does).
pub mod greeter {
    use super::Infallible;
    use std::future::{ready, Ready};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use http::uri::PathAndQuery;
    use redlimit::Decision;
    use tonic::body::Body;
    use tonic::server::{NamedService, UnaryService};
    use tonic::transport::Channel;
    use tonic::{Request, Response, Status};
    use tonic_prost::ProstCodec;

    /// The service's full name.
    pub const SERVICE: &str = "redlimit.example.Greeter";
    /// The one method's path.
    pub const SAY_HELLO: &str = "/redlimit.example.Greeter/SayHello";

    /// `message HelloRequest { string name = 1; }`
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HelloRequest {
        /// Who to greet.
        #[prost(string, tag = "1")]
        pub name: String,
    }

    /// `message HelloReply { string message = 1; }`
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HelloReply {
        /// The greeting, with the calls left in the caller's window.
        #[prost(string, tag = "1")]
        pub message: String,
    }

    /// The server side: routes `SayHello`, answers `UNIMPLEMENTED` to anything else.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct GreeterServer;

    impl NamedService for GreeterServer {
        const NAME: &'static str = SERVICE;
    }

    impl tower::Service<http::Request<Body>> for GreeterServer {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future =
            Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            Box::pin(async move {
                if request.uri().path() != SAY_HELLO {
                    return Ok(Status::unimplemented(request.uri().path().to_owned()).into_http());
                }
                let mut grpc =
                    tonic::server::Grpc::new(ProstCodec::<HelloReply, HelloRequest>::default());
                Ok(grpc.unary(SayHello, request).await)
            })
        }
    }

    struct SayHello;

    impl UnaryService<HelloRequest> for SayHello {
        type Response = HelloReply;
        type Future = Ready<Result<Response<HelloReply>, Status>>;

        fn call(&mut self, request: Request<HelloRequest>) -> Self::Future {
            // The layer puts its decision in the request's extensions.
            let left = request
                .extensions()
                .get::<Decision>()
                .map_or_else(|| "?".to_owned(), |d| d.remaining().to_string());
            let name = request.into_inner().name;
            ready(Ok(Response::new(HelloReply {
                message: format!("hello, {name}; {left} calls left in this window"),
            })))
        }
    }

    /// The client side: one `SayHello` call on `channel`.
    pub async fn say_hello(channel: Channel, name: &str) -> Result<HelloReply, Status> {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("channel not ready: {e}")))?;
        let request = Request::new(HelloRequest {
            name: name.to_owned(),
        });
        let codec = ProstCodec::<HelloRequest, HelloReply>::default();
        let reply = grpc
            .unary(request, PathAndQuery::from_static(SAY_HELLO), codec)
            .await?;
        Ok(reply.into_inner())
    }
}
