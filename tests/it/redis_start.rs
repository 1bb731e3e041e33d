//! Out loud at start: `RedisStore::connect` connects, loads the library and makes one
//! call, or fails naming the host and port (never the password).
//! `RedisStore::from_url` speaks to the server on a socket of its own: password,
//! database and Unix socket included. What the store logs is tested in
//! `tests/store_logs.rs`, a program of its own with a global subscriber.

use crate::support::{self, RedisServer};

use std::time::{Duration, Instant};

use deadpool_redis::redis;
use redlimit::store::StoreErrorKind;
use redlimit::{Limiter, Policy, RedisStore};

fn policy() -> Policy {
    Policy::fixed_window("start", 100, Duration::from_secs(60)).unwrap()
}

/// A loopback port that refuses connections for as long as the socket lives: bound,
/// never listening, so no other test's server can take it meanwhile.
fn closed_port() -> (tokio::net::TcpSocket, u16) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(([127, 0, 0, 1], 0).into()).unwrap();
    let port = socket.local_addr().unwrap().port();
    (socket, port)
}

/// The calls of each command on `server` since its last `CONFIG RESETSTAT`.
async fn calls(server: &RedisServer) -> std::collections::HashMap<String, u64> {
    support::command_calls(&mut server.conn().await).await
}

#[tokio::test]
async fn connect_loads_the_library_so_that_the_first_check_is_one_fcall() {
    for connected in [true, false] {
        let server = RedisServer::start();
        let store = RedisStore::from_url(&server.url()).unwrap();
        if connected {
            store.connect().await.unwrap();
            let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
                .arg("LIST")
                .query_async(&mut server.conn().await)
                .await
                .unwrap();
            assert_eq!(libraries.len(), 1, "connect loaded the library");
        }
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut server.conn().await)
            .await
            .unwrap();
        // A generous timeout: this test counts the calls a first check makes, not
        // how fast they are.
        let limiter = Limiter::new(store.timeout(Duration::from_secs(5)), policy());
        assert!(limiter.check("a", 1).await.unwrap().is_allowed());
        let calls = calls(&server).await;
        let fcalls = calls.get("fcall").copied().unwrap_or(0);
        let scripts = calls.get("eval").copied().unwrap_or(0);
        if connected {
            assert_eq!((fcalls, scripts), (1, 0), "{calls:?}");
        } else {
            // The control: a cold store's first check meets a server without the
            // library, and goes as the script in full.
            assert_eq!(scripts, 1, "{calls:?}");
        }
    }
}

#[tokio::test]
async fn connect_fails_naming_the_address_and_never_the_password() {
    let (_refusing, port) = closed_port();
    let url = format!("redis://app:hunter2@127.0.0.1:{port}/");
    let pool = deadpool_redis::Config::from_url(url.as_str())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    for store in [RedisStore::from_url(&url).unwrap(), RedisStore::new(pool)] {
        let asked = Instant::now();
        let error = store.connect().await.unwrap_err();
        assert!(
            asked.elapsed() < Duration::from_secs(6),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(error.kind(), StoreErrorKind::Unavailable);
        let message = error.to_string();
        assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        assert!(!format!("{store:?}").contains("hunter2"), "{store:?}");
    }
    // A URL that does not parse names itself, without the password.
    let error = RedisStore::from_url("redis://app:hunter2@127.0.0.1:notaport/").unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("redis://app:***@127.0.0.1:notaport/"),
        "{message}"
    );
    assert!(!message.contains("hunter2"), "{message}");
}

#[tokio::test]
async fn from_url_authenticates_selects_its_database_and_reaches_a_unix_socket() {
    let sockets = tempfile::tempdir().unwrap();
    let socket = sockets.path().join("redis.sock");
    let server = RedisServer::start_with(&["--unixsocket", socket.to_str().unwrap()]);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query_async(&mut server.conn().await)
        .await
        .unwrap();
    let port = server.port();

    let store = RedisStore::from_url(&format!("redis://:s3cret@127.0.0.1:{port}/3")).unwrap();
    store.connect().await.unwrap();
    let limiter = Limiter::new(store, policy());
    assert_eq!(limiter.check("a", 1).await.unwrap().remaining(), 99);
    let mut admin = redis::Client::open(format!("redis://:s3cret@127.0.0.1:{port}/3"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "the key is in database 3: {keys:?}");

    let url = format!("redis+unix://{}?pass=s3cret", socket.display());
    let store = RedisStore::from_url(&url).unwrap();
    store.connect().await.unwrap();
    let limiter = Limiter::new(store, policy());
    assert_eq!(limiter.check("b", 1).await.unwrap().remaining(), 99);

    // The wrong password: refused at connect, named, not shown.
    let store = RedisStore::from_url(&format!("redis://:n0t-the-one@127.0.0.1:{port}/")).unwrap();
    let error = store.connect().await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(!message.contains("n0t-the-one"), "{message}");
}
