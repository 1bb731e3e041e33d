//! Configuration from TOML: a good file builds rules that behave as written; each kind
//! of bad input is refused with its line and field.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use redlimit::clock::FakeClock;
use redlimit::config::Config;
use redlimit::key::Secret;
use redlimit::{Algorithm, Limiter, MemoryStore, RateLimitLayer};
use tokio::sync::{mpsc, Semaphore};
use tower::{service_fn, ServiceExt};

const GOOD: &str = r#"
trusted_proxies = ["10.0.0.0/8", "192.0.2.1"]
ipv6_prefix = 48

[[policies]]
name = "login"
algorithm = "fixed_window"
limit = 3
window = "1m"

[[policies]]
name = "api-burst"
algorithm = "token_bucket"
capacity = 5
refill = 1
window = "500ms"

[[policies]]
name = "api-hour"
algorithm = "sliding_window"
limit = 100
window = "1h"

[[policies]]
name = "site"
algorithm = "sliding_log"
limit = 2
window = "10s"

[[rules]]
method = "post"
path = "/login"
policy = "login"
key = "ip"

[[rules]]
path = "/api/{*rest}"
policies = ["api-burst", "api-hour"]
key = "header:x-api-key"

[[rules]]
grpc = "shop.v1.Orders"
policy = "login"
key = "ip+route"

[default]
policy = "site"
key = "ip"
"#;

fn secret(value: &str) -> Secret {
    Secret::new(value).unwrap()
}

fn request(method: &str, path: &str, peer: [u8; 4], headers: &[(&str, &str)]) -> Request<String> {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let mut request = request.body(String::new()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::from((peer, 40000)));
    request
}

#[tokio::test]
async fn a_good_file_builds_rules_that_behave_as_written() {
    let config = Config::from_toml_str(GOOD).unwrap();
    assert_eq!(config.policy("api-hour").unwrap().limit(), 100);
    let clock = FakeClock::new(0);
    let rules = config
        .header_secret(secret("s1"))
        .rules(MemoryStore::with_clock(clock.clone()))
        .unwrap();
    assert_eq!(rules.len(), 3);
    let service = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::rules(rules))
        .service(service_fn(|_req: Request<String>| async {
            Ok::<_, std::convert::Infallible>(Response::new(String::new()))
        }));
    let send = |req| {
        let service = service.clone();
        async move { service.oneshot(req).await.unwrap() }
    };

    // /login: 3 a minute per client address (the method matched in any case).
    for _ in 0..3 {
        let ok = send(request("POST", "/login", [203, 0, 113, 1], &[])).await;
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let denied = send(request("POST", "/login", [203, 0, 113, 1], &[])).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["ratelimit-policy"], r#""login";q=3;w=60"#);

    // Behind a trusted proxy, the forwarded address is the client: a fresh quota.
    let forwarded = [("x-forwarded-for", "203.0.113.2")];
    let via_proxy = send(request("POST", "/login", [10, 1, 2, 3], &forwarded)).await;
    assert_eq!(via_proxy.status(), StatusCode::OK);
    assert_eq!(via_proxy.headers()["ratelimit"], r#""login";r=2;t=60"#);
    // The same header from an untrusted peer is ignored: that peer is the client.
    let spoofed = [("x-forwarded-for", "203.0.113.1")];
    let direct = send(request("POST", "/login", [198, 51, 100, 9], &spoofed)).await;
    assert_eq!(direct.headers()["ratelimit"], r#""login";r=2;t=60"#);

    // /api: both policies, keyed by API key; the burst of 5 binds first.
    let key = [("x-api-key", "k1")];
    for _ in 0..5 {
        let ok = send(request("GET", "/api/items/1", [203, 0, 113, 1], &key)).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers()["ratelimit-policy"],
            r#""api-burst";q=5;w=3, "api-hour";q=100;w=3600"#
        );
    }
    let denied = send(request("GET", "/api/items/1", [203, 0, 113, 1], &key)).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let anonymous = send(request("GET", "/api/items/1", [203, 0, 113, 1], &[])).await;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    clock.advance(std::time::Duration::from_millis(500));
    let refilled = send(request("GET", "/api/items/1", [203, 0, 113, 1], &key)).await;
    assert_eq!(refilled.status(), StatusCode::OK);

    // gRPC: the whole service, per address and method.
    let grpc = [("content-type", "application/grpc")];
    for method in ["Place", "Cancel"] {
        let path = format!("/shop.v1.Orders/{method}");
        for _ in 0..3 {
            let ok = send(request("POST", &path, [203, 0, 113, 5], &grpc)).await;
            assert_eq!(ok.status(), StatusCode::OK, "{path}");
        }
        let denied = send(request("POST", &path, [203, 0, 113, 5], &grpc)).await;
        assert_eq!(denied.headers()["ratelimit-policy"], r#""login";q=3;w=60"#);
        // A 429, or RESOURCE_EXHAUSTED where the layer answers gRPC in kind.
        let exhausted = denied
            .headers()
            .get("grpc-status")
            .is_some_and(|s| s == "8");
        assert!(
            denied.status() == StatusCode::TOO_MANY_REQUESTS || exhausted,
            "{path}"
        );
    }

    // Everything else: the default, 2 per 10 s per address.
    for _ in 0..2 {
        let ok = send(request("GET", "/about", [203, 0, 113, 7], &[])).await;
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let denied = send(request("GET", "/about", [203, 0, 113, 7], &[])).await;
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers()["retry-after"], "10");
}

/// A small valid file with `line` replaced, for one mistake at a time.
fn with(replace: &str, by: &str) -> String {
    let text = GOOD.replacen(replace, by, 1);
    assert_ne!(text, GOOD, "{replace:?} is not in the good file");
    text
}

fn error_of(text: &str) -> String {
    Config::from_toml_str(text).unwrap_err().to_string()
}

#[test]
fn each_kind_of_bad_input_names_its_line_and_field() {
    let cases = [
        // An unknown policy name in a rule.
        (
            with("policy = \"login\"\nkey = \"ip\"", "policy = \"logn\"\nkey = \"ip\""),
            r#"line 33, rules[0].policy: unknown policy "logn""#,
        ),
        // ... and in a list.
        (
            with(r#"["api-burst", "api-hour"]"#, r#"["api-burst", "api-day"]"#),
            r#"line 38, rules[1].policies[1]: unknown policy "api-day""#,
        ),
        // A window that is not a duration.
        (
            with(r#"window = "1m""#, r#"window = "1 minute""#),
            r#"line 9, policies[0].window: "1 minute" is not a duration such as "500ms", "10s", "1m", "1h" or "1d""#,
        ),
        // An unknown algorithm.
        (
            with(r#"algorithm = "sliding_log""#, r#"algorithm = "leaky_bucket""#),
            r#"line 26, policies[3].algorithm: unknown algorithm "leaky_bucket": use fixed_window, sliding_window, sliding_log, token_bucket or in_flight"#,
        ),
        // A value of the wrong type.
        (
            with("limit = 3", "limit = \"three\""),
            "line 8, policies[0].limit: invalid type: string \"three\", expected u32",
        ),
        // A negative number.
        (
            with("limit = 3", "limit = -3"),
            "line 8, policies[0].limit: invalid value: integer `-3`, expected u32",
        ),
        // A limit of zero, refused by the policy itself.
        (
            with("limit = 3", "limit = 0"),
            r#"line 8, policies[0].limit: policy "login": the limit must be at least 1"#,
        ),
        // A misspelt field.
        (
            with("capacity = 5", "capacty = 5"),
            "line 14, policies[1].capacty: unknown field `capacty`, expected one of `name`, `algorithm`, `limit`, `window`, `capacity`, `refill`, `slot_ttl`",
        ),
        // A token bucket given a limit.
        (
            with("capacity = 5", "capacity = 5\nlimit = 5"),
            r#"line 15, policies[1].limit: a token_bucket has a `capacity` (its burst) and a `refill` per `window`, not a `limit`"#,
        ),
        // A bad path pattern.
        (
            with(r#"path = "/api/{*rest}""#, r#"path = "api/{*rest}""#),
            r#"line 37, rules[1].path: pattern "api/{*rest}" must start with '/'"#,
        ),
        // An unknown method.
        (
            with(r#"method = "post""#, r#"method = "PSOT""#),
            r#"line 31, rules[0].method: unknown HTTP method "PSOT""#,
        ),
        // An unknown key.
        (
            with(r#"key = "ip+route""#, r#"key = "ip+path""#),
            r#"line 44, rules[2].key: unknown key "path": use "ip", "global", "route", "header:NAME", or several joined by '+'"#,
        ),
        // A bad gRPC name.
        (
            with(r#"grpc = "shop.v1.Orders""#, r#"grpc = "shop.v1.Orders/""#),
            r#"line 42, rules[2].grpc: "shop.v1.Orders/" has a method that is not a gRPC method name; write "package.Service" or "package.Service/Method""#,
        ),
        // A proxy network that is not one.
        (
            with(r#""10.0.0.0/8""#, r#""10.0.0.0/33""#),
            r#"line 2, trusted_proxies[0]: "10.0.0.0/33" is not an IP network such as "10.0.0.0/8" or an address"#,
        ),
        // An IPv6 prefix out of range.
        (
            with("ipv6_prefix = 48", "ipv6_prefix = 129"),
            "line 3, ipv6_prefix: 129 is not a prefix length from 1 to 128",
        ),
        // A policy defined twice.
        (
            with(r#"name = "site""#, r#"name = "login""#),
            r#"line 25, policies[3].name: policy "login" is defined twice"#,
        ),
        // A rule without a key.
        (
            with("policy = \"site\"\nkey = \"ip\"", "policy = \"site\""),
            r#"line 46, default.key: needs `key`: "ip", "global", "route", "header:NAME" or a combination such as "ip+route""#,
        ),
        // A TOML syntax error.
        (
            with("limit = 100", "limit = = 100"),
            "line 21: ",
        ),
    ];
    for (text, expected) in cases {
        let error = error_of(&text);
        assert!(
            error.starts_with(expected),
            "expected: {expected}\n     got: {error}"
        );
    }
}

#[test]
fn errors_expose_line_and_field_apart() {
    let error = Config::from_toml_str(&with(
        "policy = \"login\"\nkey = \"ip\"",
        "policy = \"logn\"\nkey = \"ip\"",
    ))
    .unwrap_err();
    assert_eq!(error.line(), Some(33));
    assert_eq!(error.field(), "rules[0].policy");
    assert_eq!(error.message(), r#"unknown policy "logn""#);
}

#[test]
fn files_are_read_and_named_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("limits.toml");
    std::fs::write(&good, GOOD).unwrap();
    let config = Config::from_path(&good).unwrap();
    // An error found when the rules are built names the file too.
    let no_secret = config.rules(MemoryStore::new()).unwrap_err();
    assert_eq!(no_secret.path(), Some(good.as_path()));

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, with("limit = 3", "limit = 0")).unwrap();
    let error = Config::from_path(&bad).unwrap_err();
    assert_eq!(error.path(), Some(bad.as_path()));
    assert!(error
        .to_string()
        .starts_with(&format!("{}: line 8, policies[0].limit", bad.display())));

    let missing = Config::from_path(dir.path().join("none.toml")).unwrap_err();
    assert_eq!(missing.line(), None);
}

#[tokio::test]
async fn header_keys_hash_with_the_secret_given_in_code() {
    let config = Config::from_toml_str(GOOD).unwrap();
    assert!(!format!("{:?}", config.clone().header_secret(secret("hunter2"))).contains("hunter2"));
    // One memory store under three layers: a shared count means the same subject.
    let store = MemoryStore::with_clock(FakeClock::new(0));
    let layer = |config: Config| {
        tower::ServiceBuilder::new()
            .layer(RateLimitLayer::rules(config.rules(store.clone()).unwrap()))
            .service(service_fn(|_req: Request<String>| async {
                Ok::<_, std::convert::Infallible>(Response::new(String::new()))
            }))
    };
    let first = layer(config.clone().header_secret(secret("s1")));
    let same = layer(config.clone().header_secret(secret("s1")));
    let other = layer(config.clone().header_secret(secret("s2")));
    let key = [("x-api-key", "k1")];
    let api = || request("GET", "/api/x", [203, 0, 113, 1], &key);
    // The burst of 5 spent under secret s1 ...
    for _ in 0..5 {
        assert_eq!(
            first.clone().oneshot(api()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    // ... is spent for every instance with the same secret,
    let shared = same.oneshot(api()).await.unwrap();
    assert_eq!(shared.status(), StatusCode::TOO_MANY_REQUESTS);
    // and untouched under another secret: another subject.
    assert_eq!(other.oneshot(api()).await.unwrap().status(), StatusCode::OK);
}

#[test]
fn header_keys_without_a_secret_are_refused_with_the_line_of_the_key() {
    let config = Config::from_toml_str(GOOD).unwrap();
    let error = config.rules(MemoryStore::new()).unwrap_err();
    let at = GOOD.find(r#"key = "header:x-api-key""#).unwrap();
    let line = GOOD[..at].matches('\n').count() + 1;
    assert_eq!(error.line(), Some(line));
    assert_eq!(error.field(), "rules[1].key");
    assert!(
        error.message().contains("\"header:x-api-key\"")
            && error.message().contains("Config::header_secret"),
        "{error}"
    );
    // Keys that hash nothing need no secret.
    let no_header = GOOD.replace(r#"key = "header:x-api-key""#, r#"key = "ip""#);
    assert!(Config::from_toml_str(&no_header)
        .unwrap()
        .rules(MemoryStore::new())
        .is_ok());
}

/// The complete example of docs/config.md, as the page shows it: its one `toml` block
/// with policies.
fn page_example() -> &'static str {
    const PAGE: &str = include_str!("../../docs/config.md");
    let examples: Vec<&str> = PAGE
        .split("```toml\n")
        .skip(1)
        .filter_map(|block| block.split_once("```").map(|(toml, _)| toml))
        .filter(|toml| toml.contains("[[policies]]"))
        .collect();
    assert_eq!(examples.len(), 1, "docs/config.md shows one complete file");
    examples[0]
}

fn hello() -> impl tower::Service<
    Request<String>,
    Response = Response<String>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone {
    service_fn(|_req: Request<String>| async {
        Ok::<_, std::convert::Infallible>(Response::new(String::new()))
    })
}

#[tokio::test]
async fn the_page_s_complete_example_builds_what_it_says() {
    let config = Config::from_toml_str(page_example()).unwrap();
    let policy = |name: &str| config.policy(name).unwrap().clone();
    let expected = [
        ("login", Algorithm::SlidingLog, 5, Duration::from_secs(60)),
        (
            "api-hour",
            Algorithm::SlidingWindow,
            1000,
            Duration::from_secs(3600),
        ),
        (
            "api-running",
            Algorithm::InFlight,
            8,
            Duration::from_secs(30),
        ),
        ("site", Algorithm::FixedWindow, 100, Duration::from_secs(60)),
        // A bucket's window is its fill time: 20 tokens at 10 a second.
        (
            "api-burst",
            Algorithm::TokenBucket,
            20,
            Duration::from_secs(2),
        ),
    ];
    for (name, algorithm, limit, window) in expected {
        let p = policy(name);
        assert_eq!(
            (p.algorithm(), p.limit(), p.window()),
            (algorithm, limit, window),
            "{name}"
        );
    }
    assert_eq!(policy("api-burst").emission_interval_us(), 100_000);

    let clock = FakeClock::new(0);
    let rules = config
        .header_secret(secret("s1"))
        .rules(MemoryStore::with_clock(clock.clone()))
        .unwrap();
    assert_eq!(rules.len(), 3);
    let service = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::rules(rules))
        .service(hello());
    let send = |req| service.clone().oneshot(req);

    // /login, POST only: 5 a minute per address, exactly.
    for _ in 0..5 {
        let ok = send(request("POST", "/login", [203, 0, 113, 1], &[]))
            .await
            .unwrap();
        assert_eq!(ok.headers()["ratelimit-policy"], r#""login";q=5;w=60"#);
    }
    let denied = send(request("POST", "/login", [203, 0, 113, 1], &[]))
        .await
        .unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // A trusted single address forwards its client's: a budget of its own.
    let forwarded = [("x-forwarded-for", "203.0.113.2")];
    let via_proxy = send(request("POST", "/login", [192, 0, 2, 10], &forwarded))
        .await
        .unwrap();
    assert_eq!(via_proxy.headers()["ratelimit"], r#""login";r=4;t=60"#);
    // GET /login is no rule's: the default, 100 a minute.
    let page = send(request("GET", "/login", [203, 0, 113, 1], &[]))
        .await
        .unwrap();
    assert_eq!(page.headers()["ratelimit-policy"], r#""site";q=100;w=60"#);

    // /api: three policies in one check, the requests running at once among them.
    let key = [("x-api-key", "k1")];
    let api = send(request("GET", "/api/v1/items", [203, 0, 113, 1], &key))
        .await
        .unwrap();
    assert_eq!(
        api.headers()["ratelimit-policy"],
        r#""api-burst";q=20;w=2, "api-hour";q=1000;w=3600, "api-running";q=8;qu="concurrent-requests""#
    );
    let anonymous = send(request("GET", "/api/v1/items", [203, 0, 113, 1], &[]))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);

    // gRPC: one method of the service, per address and route.
    let grpc = [("content-type", "application/grpc")];
    let place = send(request(
        "POST",
        "/shop.v1.Orders/Place",
        [203, 0, 113, 1],
        &grpc,
    ))
    .await
    .unwrap();
    assert_eq!(
        place.headers()["ratelimit-policy"],
        r#""api-burst";q=20;w=2"#
    );
    let cancel = send(request(
        "POST",
        "/shop.v1.Orders/Cancel",
        [203, 0, 113, 1],
        &grpc,
    ))
    .await
    .unwrap();
    assert_eq!(cancel.headers()["ratelimit-policy"], r#""site";q=100;w=60"#);
}

/// The fields a table of the file takes, as the loader lists them for a field it
/// does not know.
fn accepted_fields(table_header: &str) -> BTreeSet<String> {
    let text = format!("{table_header}\nno_such_field = 1\n");
    let error = Config::from_toml_str(&text).unwrap_err().to_string();
    let (_, list) = error
        .split_once("expected one of ")
        .unwrap_or_else(|| panic!("{error}"));
    list.split(", ")
        .map(|field| field.trim().trim_matches('`').to_owned())
        .collect()
}

/// The keys the example writes in each kind of table (`""`: the top level).
fn written_fields(example: &str, table_header: &str) -> BTreeSet<String> {
    let mut table = "";
    let mut fields = BTreeSet::new();
    for line in example.lines().map(str::trim) {
        if line.starts_with('[') {
            table = line.split('#').next().unwrap().trim();
            if table_header.is_empty() {
                fields.insert(table.trim_matches(['[', ']']).to_owned());
            }
        } else if let Some((key, _)) = line.split_once('=') {
            if table == table_header && !line.starts_with('#') {
                fields.insert(key.trim().to_owned());
            }
        }
    }
    fields
}

#[test]
fn the_page_s_complete_example_shows_every_field_the_file_takes() {
    let example = page_example();
    for header in ["", "[[policies]]", "[[rules]]", "[default]"] {
        let accepted = accepted_fields(header);
        let mut written = written_fields(example, header);
        if header == "[default]" {
            // The default takes a rule's `policy` or `policies`: one is enough to show.
            written.extend(written_fields(example, "[[rules]]"));
        }
        let missing: Vec<_> = accepted.difference(&written).collect();
        assert!(
            missing.is_empty(),
            "docs/config.md's example has no {missing:?} in {header:?}"
        );
    }
}

#[tokio::test]
async fn an_in_flight_policy_from_the_file_bounds_requests_running_at_once() {
    let config = Config::from_toml_str(
        "[[policies]]\nname = \"running\"\nalgorithm = \"in_flight\"\nlimit = 2\nslot_ttl = \"30s\"\n",
    )
    .unwrap();
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(),
        config.policy("running").unwrap().clone(),
    ));
    let first = limiter.check("k", 1).await.unwrap();
    let second = limiter.check("k", 1).await.unwrap();
    assert!(first.is_allowed() && second.is_allowed());
    let (one, _two) = (
        limiter.hold("k", &first).unwrap(),
        limiter.hold("k", &second).unwrap(),
    );
    assert!(!limiter.check("k", 1).await.unwrap().is_allowed());
    assert!(limiter.check("other", 1).await.unwrap().is_allowed());
    drop(one);
    assert!(limiter.check("k", 1).await.unwrap().is_allowed());
}

#[tokio::test]
async fn rules_from_the_file_hold_an_in_flight_slot_until_the_response_ends() {
    let config = Config::from_toml_str(
        r#"
[[policies]]
name = "running"
algorithm = "in_flight"
limit = 2
slot_ttl = "30s"

[default]
policy = "running"
key = "global"
"#,
    )
    .unwrap();
    // The handler says when it runs and waits for a permit to answer.
    let (entered, mut running) = mpsc::unbounded_channel();
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let gate = gate.clone();
        service_fn(move |_req: Request<String>| {
            let (entered, gate) = (entered.clone(), gate.clone());
            async move {
                entered.send(()).unwrap();
                gate.acquire().await.unwrap().forget();
                Ok::<_, std::convert::Infallible>(Response::new(String::new()))
            }
        })
    };
    let service = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::rules(
            config.rules(MemoryStore::new()).unwrap(),
        ))
        .service(handler);
    let send = |path: &'static str| {
        let service = service.clone();
        tokio::spawn(async move {
            let response = service
                .oneshot(request("GET", path, [203, 0, 113, 1], &[]))
                .await;
            // The slot is held until the body ends: read it to the end.
            let response = response.unwrap();
            let status = response.status();
            http_body_util::BodyExt::collect(response.into_body())
                .await
                .unwrap();
            status
        })
    };
    let (a, b) = (send("/a"), send("/b"));
    running.recv().await.unwrap();
    running.recv().await.unwrap();
    // Two running: a third is refused (the handler is not reached).
    let third = send("/c").await.unwrap();
    assert_eq!(third, StatusCode::TOO_MANY_REQUESTS);
    gate.add_permits(2);
    assert_eq!(
        (a.await.unwrap(), b.await.unwrap()),
        (StatusCode::OK, StatusCode::OK)
    );
    gate.add_permits(1);
    assert_eq!(send("/d").await.unwrap(), StatusCode::OK);
}

#[test]
fn in_flight_fields_are_checked_like_the_others() {
    let file = |fields: &str| {
        format!("[[policies]]\nname = \"running\"\nalgorithm = \"in_flight\"\n{fields}")
    };
    let cases = [
        (
            file("limit = 2\nwindow = \"30s\"\n"),
            "line 5, policies[0].window: an in_flight policy counts requests running at once: it has a `limit` and a `slot_ttl`, not a `window`",
        ),
        (
            file("limit = 2\n"),
            "line 1, policies[0].slot_ttl: policy \"running\" needs `slot_ttl`",
        ),
        (
            file("slot_ttl = \"30s\"\n"),
            "line 1, policies[0].limit: policy \"running\" needs `limit`",
        ),
        (
            file("limit = 2\nslot_ttl = \"0ms\"\n"),
            "line 5, policies[0].slot_ttl: policy \"running\": the window must be at least 1 ms",
        ),
        (
            file("limit = 0\nslot_ttl = \"30s\"\n"),
            "line 4, policies[0].limit: policy \"running\": the limit must be at least 1",
        ),
        (
            file("limit = 2\nslot_ttl = \"half a minute\"\n"),
            "line 5, policies[0].slot_ttl: \"half a minute\" is not a duration",
        ),
        (
            with(r#"window = "10s""#, "window = \"10s\"\nslot_ttl = \"10s\""),
            "line 29, policies[3].slot_ttl: only an in_flight policy has a `slot_ttl`; the others have a `window`",
        ),
    ];
    for (text, expected) in cases {
        let error = error_of(&text);
        assert!(
            error.starts_with(expected),
            "expected: {expected}\n     got: {error}"
        );
    }
}
