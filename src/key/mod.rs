//! Key extractors: which subject a request is limited as.
//!
//! ```
//! use std::net::SocketAddr;
//! use http::{Request, StatusCode};
//! use redlimit::key::{ClientIp, Header, KeyExtractor, KeyExtractorExt, Route, Secret};
//!
//! // API keys are hashed with a secret of yours (`Secret::from_env`, a secret store).
//! let secret = Secret::new("from your secret store")?;
//! // Per API key when the client sends one, else per client address; and per route.
//! let key = Header::new("x-api-key", &secret)?
//!     .or(ClientIp::new())
//!     .and(Route::new());
//!
//! let (mut parts, ()) = Request::get("/users/7").body(()).unwrap().into_parts();
//! // The server puts the peer address in the extensions (axum's `ConnectInfo`,
//! // tonic's `TcpConnectInfo`, or a plain `SocketAddr` for bare hyper and tests).
//! parts.extensions.insert(SocketAddr::from(([203, 0, 113, 7], 4711)));
//! let by_ip = key.extract(&parts).unwrap();
//!
//! parts.headers.insert("x-api-key", "sk_live_abc".parse().unwrap());
//! let by_api_key = key.extract(&parts).unwrap();
//! assert_ne!(by_ip, by_api_key);
//! assert!(!format!("{by_api_key:?}").contains("sk_live"));
//!
//! // A missing subject is a 4xx the layer answers with, never a 500.
//! let rejection = Header::new("x-api-key", &secret)?.extract(&Request::get("/").body(()).unwrap().into_parts().0);
//! assert_eq!(rejection.unwrap_err().status(), StatusCode::UNAUTHORIZED);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The extractors, their subjects and rejections, and how to combine them, are on the
//! keys page, below.
//!
#![doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/keys.md"))]

mod client_ip;
mod combine;
mod extension;
mod extractor;
mod forwarding;
mod from_fn;
mod global;
mod header;
mod route;

pub use client_ip::{ClientIp, ForwardedHeader};
pub use combine::{KeyExtractorExt, Or, Pair, RejectWith, Within};
pub use extension::Extension;
pub use extractor::{KeyExtractor, KeyRejection};
pub use from_fn::{from_fn, FromFn};
pub use global::Global;
pub use header::{Header, InvalidHeaderName};
pub use route::Route;

pub use crate::subject::{Secret, SecretError};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::request::Parts;
    use http::StatusCode;

    use super::*;
    use crate::subject::Subject;

    fn parts() -> Parts {
        http::Request::new(()).into_parts().0
    }

    #[test]
    fn arcs_and_boxes_are_extractors() {
        let boxed: Box<dyn KeyExtractor> = Box::new(Global);
        let shared: Arc<dyn KeyExtractor> = Arc::new(Route::new());
        let in_arc = Arc::new(Global);
        assert_eq!(boxed.extract(&parts()), Ok(Subject::new("global")));
        assert_eq!(in_arc.extract(&parts()), Ok(Subject::new("global")));
        assert_eq!(shared.extract(&parts()), Ok(Subject::new("route=GET /")));
        // Erased extractors still combine.
        let both = boxed.and(shared);
        assert!(both.extract(&parts()).is_ok());
    }

    #[test]
    fn rejections_show_status_and_message() {
        let r = KeyRejection::new(StatusCode::FORBIDDEN, "client address unavailable");
        assert_eq!(r.to_string(), "403 Forbidden: client address unavailable");
        assert_eq!(r.message(), "client address unavailable");
        let shared = KeyRejection::new(
            StatusCode::FORBIDDEN,
            String::from("client address unavailable"),
        );
        assert_eq!(shared, r);
        assert_eq!(format!("{:?}", shared.clone()), format!("{r:?}"));
        assert_eq!(
            format!("{r:?}"),
            "403 Forbidden: client address unavailable"
        );
    }
}
