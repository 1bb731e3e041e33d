//! The route a request is for: its method and path template.

use http::request::Parts;

use super::extractor::{KeyExtractor, KeyRejection, SubjectBuf};
use crate::subject::Subject;

/// Keys requests by method and route, such as `route=GET /users/{id}`.
///
/// ```
/// use http::Request;
/// use redlimit::key::{KeyExtractor, Route};
/// use redlimit::Subject;
///
/// let (parts, ()) = Request::post("/login?next=/").body(()).unwrap().into_parts();
/// assert_eq!(Route::new().extract(&parts), Ok(Subject::new("route=POST /login")));
/// ```
///
/// The path is axum's `MatchedPath` (the route template, like `/users/{id}`) when the
/// `axum` feature is on and the router set one; otherwise the request's URI path,
/// without the query. A raw path that holds ids (`/users/7`, `/users/8`) makes one
/// subject per id: under axum, apply the layer to the router (`Router::layer` or
/// `route_layer`) so the template is known. Combine with a client key for a limit per
/// client and route: `Route::new().and(ClientIp::new())`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Route {
    _private: (),
}

impl Route {
    /// Method and path template (or URI path).
    pub fn new() -> Self {
        Self::default()
    }
}

impl KeyExtractor for Route {
    fn extract(&self, parts: &Parts) -> Result<Subject, KeyRejection> {
        Ok(SubjectBuf::default()
            .push(b"route=")
            .push(parts.method.as_str().as_bytes())
            .push(b" ")
            .push(path(parts).as_bytes())
            .subject())
    }
}

fn path(parts: &Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(matched) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return matched.as_str();
    }
    parts.uri.path()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_and_path_without_query() {
        let (parts, ()) = http::Request::delete("/users/7?x=1")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(
            Route::new().extract(&parts),
            Ok(Subject::new("route=DELETE /users/7"))
        );
    }

    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn axum_route_templates_group_ids() {
        use std::sync::{Arc, Mutex};

        use axum::routing::get;
        use axum::Router;
        use tower::ServiceExt;

        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let app =
            Router::new()
                .route("/users/{id}", get(|| async {}))
                .layer(axum::middleware::from_fn(
                    move |req: axum::extract::Request, next: axum::middleware::Next| {
                        let (parts, body) = req.into_parts();
                        let subject = Route::new().extract(&parts);
                        record.lock().unwrap().push(subject);
                        next.run(axum::extract::Request::from_parts(parts, body))
                    },
                ));
        for uri in ["/users/7", "/users/8"] {
            let req = http::Request::get(uri)
                .body(axum::body::Body::empty())
                .unwrap();
            app.clone().oneshot(req).await.unwrap();
        }
        let seen = seen.lock().unwrap();
        let expected = Ok(Subject::new("route=GET /users/{id}"));
        assert_eq!(*seen, vec![expected.clone(), expected]);
    }
}
