//! Round trips of every call shape against a real `redis-server`: encoded in Rust,
//! run by the real Lua (the function library, and the call shape's script as a server
//! without functions runs it), decoded into the shape's typed reply. Here and not in
//! `tests/it` because the encoders and replies are the store's own.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, aio::MultiplexedConnection, FromRedisValue, Value};

use super::reply::{decode, BatchReply, LeaseReply, PolicyReply, Reply};
use super::*;
use crate::algorithm::State;
use crate::internals::RedisStoreInternals;
use crate::policy::Policy;
use crate::store::redis::command::{Batch, Call, GivingBack, Leasing, Request, Run};
use crate::store::redis::keys::lease_key_of;
use crate::store::redis::script::{Library, Via};
use crate::store::{GiveBack, LeaseAsk, Operation, StoreErrorKind};

/// A `redis-server` on a free loopback port, with no persistence, killed on drop.
/// (`REDLIMIT_REDIS_SERVER` names another binary, as for the integration tests.)
struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Self {
        let binary =
            std::env::var("REDLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        // A free port can be taken by someone else between probing and binding: retry.
        for _ in 0..5 {
            let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("no free loopback port");
            let dir = tempfile::tempdir().expect("a temporary directory");
            let mut child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {binary} (the round trips need it): {e}"));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if ping(port) {
                    return Self {
                        child,
                        port,
                        _dir: dir,
                    };
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not start");
    }

    /// A connection with the library loaded.
    async fn conn(&self) -> MultiplexedConnection {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: Value = Library::get()
            .load_command()
            .query_async(&mut conn)
            .await
            .unwrap();
        conn
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(100)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

/// The two Lua compositions every single call has: the library's function, and its
/// shape's script (sent in full, as after `NOSCRIPT`).
const VIAS: [Via; 2] = [Via::Function, Via::ScriptSource];

/// `request` sent `via`, its reply decoded as the store decodes it.
async fn round_trip<R: Request>(
    conn: &mut MultiplexedConnection,
    request: &R,
    via: Via,
) -> R::Reply {
    let value: Value = request
        .command(via)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{via:?}: {e}"));
    decode::<R::Reply>(value).unwrap_or_else(|e| panic!("{via:?}: {e}"))
}

/// Ten a second, and a token bucket of 10 refilling one per 100 ms.
fn policies() -> Arc<[Policy]> {
    vec![
        Policy::fixed_window("fw", 10, Duration::from_secs(1)).unwrap(),
        Policy::token_bucket("tb", 10, 10, Duration::from_secs(1)).unwrap(),
    ]
    .into()
}

/// The client clock of every call: 250 ms into window 10 of the fixed window.
const NOW: u64 = 10_250;

fn call<S>(base: &str, policies: &Arc<[Policy]>, cost: u64, shape: S) -> Call<S> {
    Call {
        key_base: base.to_owned(),
        own_keys: None,
        now_ms: Some(NOW),
        cost,
        policies: Arc::clone(policies),
        shape,
    }
}

fn outcome(allowed: bool, remaining: u64, reset: u64, retry: u64) -> PolicyReply {
    PolicyReply {
        allowed,
        remaining,
        reset_after_ms: reset,
        retry_after_ms: retry,
    }
}

/// A plain check.
const CHECK: Run = Run(Operation::Check);

/// The fixed window's stored state (`<window>:<count>`) under `base`: the first of
/// the joint key's two.
async fn fixed_state(conn: &mut MultiplexedConnection, base: &str) -> Option<String> {
    let raw: Option<Vec<u8>> = redis::cmd("GET")
        .arg(format!("{base}~"))
        .query_async(conn)
        .await
        .unwrap();
    let raw = raw?;
    let part = super::state::joint_parts(&raw, 2)[0]?;
    Some(super::state::render(&policies()[0], part).expect("a fixed window's state"))
}

#[tokio::test]
async fn a_check_round_trips() {
    let server = Server::start();
    let mut conn = server.conn().await;
    let p = policies();
    for via in VIAS {
        let base = format!("rt:{{check-{via:?}}}:t:");
        let reply = round_trip(&mut conn, &call(&base, &p, 3, CHECK), via).await;
        // 3 of 10 in the window, 750 ms to its end; the bucket full again 300 ms on.
        assert_eq!(
            reply.0.as_slice(),
            [outcome(true, 7, 750, 0), outcome(true, 7, 300, 0)],
            "{via:?}"
        );
        assert_eq!(fixed_state(&mut conn, &base).await.as_deref(), Some("10:3"));
        // 8 more fit neither: denied, with the window's wait, nothing written.
        let reply = round_trip(&mut conn, &call(&base, &p, 8, CHECK), via).await;
        assert_eq!(reply.0[0], outcome(false, 7, 750, 750), "{via:?}");
        assert!(
            !reply.0[1].allowed && reply.0[1].retry_after_ms > 0,
            "{via:?}"
        );
        assert_eq!(fixed_state(&mut conn, &base).await.as_deref(), Some("10:3"));
        let decision = reply.decision(&p, 1).unwrap();
        assert!(!decision.is_allowed());
        assert_eq!(decision.retry_after(), Some(Duration::from_millis(750)));
    }
}

#[tokio::test]
async fn the_admin_operations_round_trip() {
    let server = Server::start();
    let mut conn = server.conn().await;
    let p = policies();
    for via in VIAS {
        let base = format!("rt:{{admin-{via:?}}}:t:");
        round_trip(&mut conn, &call(&base, &p, 4, CHECK), via).await;
        // A peek of 2 answers as that check would, and writes nothing.
        let peek = round_trip(&mut conn, &call(&base, &p, 2, Run(Operation::Peek)), via).await;
        assert_eq!(peek.0[0], outcome(true, 4, 750, 0), "{via:?}");
        assert_eq!(fixed_state(&mut conn, &base).await.as_deref(), Some("10:4"));
        // A refund of 3 gives them back, then answers as a peek of 3.
        let refund = round_trip(&mut conn, &call(&base, &p, 3, Run(Operation::Refund)), via).await;
        assert_eq!(refund.0[0], outcome(true, 6, 750, 0), "{via:?}");
        assert_eq!(fixed_state(&mut conn, &base).await.as_deref(), Some("10:1"));
        // A reset forgets the states and the lease generation, then peeks fresh.
        let lease_key = lease_key_of(&base);
        let _: () = redis::cmd("SET")
            .arg(&lease_key)
            .arg("1")
            .query_async(&mut conn)
            .await
            .unwrap();
        let reset = round_trip(&mut conn, &call(&base, &p, 1, Run(Operation::Reset)), via).await;
        assert_eq!(
            reset.0.as_slice(),
            [outcome(true, 9, 750, 0), outcome(true, 9, 100, 0)],
            "{via:?}"
        );
        let left: u64 = redis::cmd("EXISTS")
            .arg(format!("{base}~"))
            .arg(&lease_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(left, 0, "{via:?}");
    }
}

#[tokio::test]
async fn a_leasing_check_and_its_give_back_round_trip() {
    let server = Server::start();
    let mut conn = server.conn().await;
    let p = policies();
    for via in VIAS {
        let base = format!("rt:{{lease-{via:?}}}:t:");
        let ask = LeaseAsk { want: 5, batch: 1 };
        let LeaseReply { policies, grant } =
            round_trip(&mut conn, &call(&base, &p, 1, Leasing(ask)), via).await;
        // The cost and 5 more taken from both; the lease ends with the window.
        assert_eq!(policies.0[0], outcome(true, 4, 750, 0), "{via:?}");
        assert_eq!(grant.units, 5, "{via:?}");
        assert_eq!(grant.window_left_ms, Some(750));
        assert_eq!(grant.window_end_ms, Some(11_000));
        assert_eq!(grant.ask_again_ms, 0);
        assert!(grant.epoch > 0, "{via:?}: {grant:?}");
        assert_eq!(fixed_state(&mut conn, &base).await.as_deref(), Some("10:6"));

        // Another generation's units change nothing: a peek of them.
        let stale = GiveBack {
            units: 4,
            before_ms: 11_000,
            epoch: grant.epoch + 1,
        };
        let reply = round_trip(&mut conn, &call(&base, &p, 4, GivingBack(stale)), via).await;
        assert_eq!(reply.0[0], outcome(true, 0, 750, 0), "{via:?}");
        assert_eq!(fixed_state(&mut conn, &base).await.as_deref(), Some("10:6"));
        // Nor do units of a window that is over.
        let late = GiveBack {
            units: 4,
            before_ms: NOW,
            epoch: grant.epoch,
        };
        round_trip(&mut conn, &call(&base, &p, 4, GivingBack(late)), via).await;
        assert_eq!(fixed_state(&mut conn, &base).await.as_deref(), Some("10:6"));
        // In time and in the generation: refunded, then a peek of them.
        let back = GiveBack {
            units: 4,
            before_ms: 11_000,
            epoch: grant.epoch,
        };
        let reply = round_trip(&mut conn, &call(&base, &p, 4, GivingBack(back)), via).await;
        assert_eq!(reply.0[0], outcome(true, 4, 750, 0), "{via:?}");
        assert_eq!(fixed_state(&mut conn, &base).await.as_deref(), Some("10:2"));
    }
}

/// A reply longer than one packed run (32 integers) comes back whole and in order:
/// 40 checks of one subject, 2 policies each, the first 10 admitted.
#[tokio::test]
async fn a_long_batch_reply_round_trips() {
    let server = Server::start();
    let mut conn = server.conn().await;
    let p = policies();
    for via in VIAS {
        let base = format!("rt:{{long-{via:?}}}:t:");
        let batch = Batch {
            calls: (0..40).map(|_| call(&base, &p, 1, CHECK)).collect(),
        };
        let reply: BatchReply = round_trip(&mut conn, &batch, via).await;
        // An outcome a policy: 80, from 140 integers (one an admitted outcome, two a
        // denied one: its retry too), five runs of 32 or fewer.
        assert_eq!(reply.0.len(), 80, "{via:?}");
        let decisions = reply.decisions(&batch.calls).unwrap();
        let remaining: Vec<u64> = decisions.iter().map(|d| d.remaining()).collect();
        let expected: Vec<u64> = (0..40).map(|i| 9u64.saturating_sub(i)).collect();
        assert_eq!(remaining, expected, "{via:?}");
        assert!(decisions[..10].iter().all(|d| d.is_allowed()), "{via:?}");
        assert!(decisions[10..].iter().all(|d| !d.is_allowed()), "{via:?}");
    }
}

#[tokio::test]
async fn a_batch_round_trips() {
    let server = Server::start();
    let mut conn = server.conn().await;
    let p = policies();
    let other: Arc<[Policy]> =
        vec![Policy::sliding_log("sl", 2, Duration::from_secs(1)).unwrap()].into();
    for (via, clock) in [(Via::Function, Some(NOW)), (Via::ScriptSource, None)] {
        let a = format!("rt:{{batch-a-{via:?}}}:t:");
        let b = format!("rt:{{batch-b-{via:?}}}:t:");
        let mut checks = vec![
            call(&a, &p, 2, CHECK),
            call(&b, &other, 1, CHECK),
            // The same subject again: decided on what the first wrote.
            call(&a, &p, 9, CHECK),
            call(&b, &other, 1, CHECK),
            call(&b, &other, 1, CHECK),
        ];
        for check in &mut checks {
            check.now_ms = clock;
        }
        let batch = Batch { calls: checks };
        let reply: BatchReply = round_trip(&mut conn, &batch, via).await;
        assert_eq!(reply.0.len(), 2 + 1 + 2 + 1 + 1, "{via:?}");
        assert_eq!(reply.0[0].remaining, 8, "{via:?}");
        let decisions = reply.decisions(&batch.calls).unwrap();
        let allowed: Vec<bool> = decisions.iter().map(|d| d.is_allowed()).collect();
        assert_eq!(allowed, [true, true, false, true, false], "{via:?}");
        // Both policies deny a cost of 9 with 8 left; the one reported is the one whose
        // wait is longer: on the client clock (750 ms left in the window) the fixed
        // window, on Redis TIME whichever the real time makes so.
        match clock {
            Some(_) => assert_eq!(decisions[2].denied_by(), Some("fw"), "{via:?}"),
            None => assert!(
                matches!(decisions[2].denied_by(), Some("fw" | "tb")),
                "{via:?}: {:?}",
                decisions[2]
            ),
        }
        assert_eq!(decisions[4].denied_by(), Some("sl"));
    }
}

/// The joint key's TTL and bytes `base` holds.
async fn joint_key(conn: &mut MultiplexedConnection, base: &str) -> (i64, Option<Vec<u8>>) {
    let key = format!("{base}~");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(conn)
        .await
        .unwrap();
    let raw: Option<Vec<u8>> = redis::cmd("GET").arg(&key).query_async(conn).await.unwrap();
    (pttl, raw)
}

#[tokio::test]
async fn a_joint_key_lives_as_long_as_its_longest_lived_state() {
    let server = Server::start();
    let mut conn = server.conn().await;
    // A bucket refilling in 100 ms beside a shadow hour's window of 1.
    let p: Arc<[Policy]> = vec![
        Policy::token_bucket("tb", 10, 10, Duration::from_secs(1)).unwrap(),
        Policy::fixed_window("hour", 1, Duration::from_secs(3_600))
            .unwrap()
            .shadow(),
    ]
    .into();
    let hour_left = 3_600_000 - NOW;
    for via in VIAS {
        let base = format!("rt:{{joint-ttl-{via:?}}}:t:");
        round_trip(&mut conn, &call(&base, &p, 1, CHECK), via).await;
        let (pttl, raw) = joint_key(&mut conn, &base).await;
        assert!(pttl > hour_left as i64 - 1_000, "{via:?}: {pttl}");
        // The hour denies (in shadow) and keeps its state as it was; the bucket's
        // write needs 200 ms, and the key still lives the hour out.
        let reply = round_trip(&mut conn, &call(&base, &p, 1, CHECK), via).await;
        assert!(reply.0[0].allowed && !reply.0[1].allowed, "{via:?}");
        let (pttl, after) = joint_key(&mut conn, &base).await;
        assert!(pttl > hour_left as i64 - 1_000, "{via:?}: {pttl}");
        let (before, after) = (raw.unwrap(), after.unwrap());
        let [tb, hour] = super::state::joint_parts(&before, 2)[..] else {
            unreachable!()
        };
        let now = super::state::joint_parts(&after, 2);
        assert_eq!(now[1], hour, "{via:?}: the shadow window's state as it was");
        assert_ne!(now[0], tb, "{via:?}: the bucket's state changed");
        assert_eq!(
            super::state::render(&p[1], now[1].unwrap()).as_deref(),
            Some("0:1")
        );
    }
}

#[tokio::test]
async fn a_joint_key_of_bytes_it_did_not_write_is_no_state() {
    let server = Server::start();
    let mut conn = server.conn().await;
    // A log of 60 first: its state outgrows a one-byte length.
    let p: Arc<[Policy]> = vec![
        Policy::sliding_log("sl", 60, Duration::from_secs(1)).unwrap(),
        Policy::fixed_window("fw", 100, Duration::from_secs(1)).unwrap(),
    ]
    .into();
    for via in VIAS {
        let base = format!("rt:{{joint-foreign-{via:?}}}:t:");
        for (what, raw) in [
            ("a length past the end", b"\x05ab".to_vec()),
            ("a long length cut short", b"\xff\x00\x00".to_vec()),
            (
                "a long length past the end",
                b"\xff\x00\x00\x01\x00ab".to_vec(),
            ),
            ("nothing", Vec::new()),
            ("a number", b"12".to_vec()),
        ] {
            let _: () = redis::cmd("SET")
                .arg(format!("{base}~"))
                .arg(&raw)
                .arg("PX")
                .arg(60_000)
                .query_async(&mut conn)
                .await
                .unwrap();
            let reply = round_trip(&mut conn, &call(&base, &p, 50, CHECK), via).await;
            assert_eq!(
                reply.0.as_slice(),
                [outcome(true, 10, 1_000, 0), outcome(true, 50, 750, 0)],
                "{via:?}: {what}"
            );
            let (pttl, raw) = joint_key(&mut conn, &base).await;
            let raw = raw.unwrap();
            // 50 stamps of 6 bytes and a head of 4 (a long length), then 12 bytes.
            assert_eq!(raw.len(), 5 + 304 + 12, "{via:?}: {what}");
            let parts = super::state::joint_parts(&raw, 2);
            assert_eq!(
                super::state::render(&p[1], parts[1].unwrap()).as_deref(),
                Some("10:50"),
                "{via:?}: {what}"
            );
            assert_eq!(
                super::state::decode(&p[0], parts[0].unwrap()),
                Some(State::SlidingLog {
                    stamps: vec![NOW; 50].into()
                }),
                "{via:?}: {what}"
            );
            // Kept until the newest stamp leaves the log's window.
            assert!(pttl > 0 && pttl <= 1_000, "{via:?}: {what}: {pttl}");
            let _: () = redis::cmd("DEL")
                .arg(format!("{base}~"))
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
}

#[test]
fn malformed_replies_are_protocol_errors_of_every_shape() {
    let ints = super::reply::packed;
    let doubles = |x: &[f64]| Value::BulkString(x.iter().flat_map(|x| x.to_be_bytes()).collect());
    fn kind<T: FromRedisValue>(value: Value) -> Option<StoreErrorKind> {
        decode::<T>(value).err().map(|e| e.kind())
    }
    let protocol = Some(StoreErrorKind::Protocol);
    // A packed outcome is one integer when allowed, two when denied (its retry), a
    // marker and three for one too wide to pack: anything else is no reply.
    let denied = (750 << (1 + PACK_REMAINING_BITS)) | (7 << 1);
    for bad in [
        Value::Nil,
        Value::Okay,
        ints(&[denied]),
        ints(&[-3]),
        ints(&[PACK_WIDE_ALLOWED, 1, 2]),
        Value::Array(vec![Value::Okay]),
        // Integers, but not as the Lua sends them: an array, or a string of another
        // length than 8 bytes an integer.
        Value::Array(vec![Value::Int(1)]),
        Value::BulkString(vec![0; 7]),
        Value::BulkString(vec![0; 9]),
        // Packed, but not integers below 2^53.
        doubles(&[0.5]),
        doubles(&[1.0, f64::NAN]),
        doubles(&[9_007_199_254_740_992.0]),
        doubles(&[f64::INFINITY]),
    ] {
        assert_eq!(kind::<Reply>(bad.clone()), protocol, "{bad:?}");
        assert_eq!(kind::<BatchReply>(bad.clone()), protocol, "{bad:?}");
    }
    let fine = decode::<Reply>(ints(&[denied, 750, 1, PACK_WIDE_DENIED, 1 << 40, 2, 3])).unwrap();
    assert_eq!(
        fine.0.as_slice(),
        [
            outcome(false, 7, 750, 750),
            outcome(true, 0, 0, 0),
            outcome(false, 1 << 40, 2, 3)
        ]
    );
    // The largest integer a double holds exactly, and a lone integer (a lone outcome
    // that packs into one) as Redis sends it, unpacked.
    let widest = (1 << 53) - 1;
    let wide = decode::<Reply>(ints(&[PACK_WIDE_ALLOWED, widest, widest, 0])).unwrap();
    assert_eq!(
        wide.0.as_slice(),
        [outcome(true, widest as u64, widest as u64, 0)]
    );
    let lone = decode::<Reply>(Value::Int(1)).unwrap();
    assert_eq!(lone.0.as_slice(), [outcome(true, 0, 0, 0)]);
    for bad in [
        ints(&[1, 2, 3, 4]),
        ints(&[-3, 0, 0, 0, 5, 0, 0, 0]),
        ints(&[denied, 0, 0, 0, 0, 0]),
    ] {
        assert_eq!(kind::<LeaseReply>(bad.clone()), protocol, "{bad:?}");
    }
    // Well formed, for another number of policies than the call's.
    let p = policies();
    let one = decode::<Reply>(ints(&[1])).unwrap();
    assert_eq!(
        one.decision(&p, 1).unwrap_err().kind(),
        StoreErrorKind::Protocol
    );
    let batch = decode::<BatchReply>(ints(&[1, 1, 1])).unwrap();
    let calls = [call("b:", &p, 1, CHECK)];
    assert_eq!(
        batch.decisions(&calls).unwrap_err().kind(),
        StoreErrorKind::Protocol
    );
}

#[test]
fn the_preamble_defines_what_the_lua_reads_once_each() {
    let preamble = preamble();
    let lua: String = [
        include_str!("../../../../lua/common.lua"),
        include_str!("../../../../lua/decide.lua"),
        include_str!("../../../../lua/main.lua"),
        include_str!("../../../../lua/batch.lua"),
        include_str!("../../../../lua/fixed_window.lua"),
        include_str!("../../../../lua/sliding_log.lua"),
    ]
    .concat();
    let library = Library::get().source();
    for (name, _) in constants() {
        let definition = format!("local {name} = ");
        assert_eq!(preamble.matches(&definition).count(), 1, "{name}");
        assert_eq!(library.matches(&definition).count(), 1, "{name}");
        assert!(!lua.contains(&definition), "{name} is defined in lua/ too");
    }
    // The composed code has the values in place of the names: a script's whole
    // source, the library's after its preamble and before its registrations.
    let fw = [Policy::fixed_window("p", 1, Duration::from_secs(1)).unwrap()];
    let code_from = library.find(&preamble).unwrap() + preamble.len();
    let code_to = library.find("redis.register_function").unwrap();
    let scripts = [
        crate::RedisStore::script_source(&fw),
        crate::store::redis::script::Shape::of(&fw, Entry::Admin)
            .script()
            .source(),
        crate::store::redis::script::Shape::of(&fw, Entry::Lease)
            .script()
            .source(),
        &library[code_from..code_to],
    ];
    for script in scripts {
        // Comments and strings keep the names as written (see inline).
        let code: String = lua_spans(script)
            .into_iter()
            .map(|(is_code, text)| if is_code { text } else { " " })
            .collect();
        let script = code.as_str();
        for (name, _) in constants() {
            let as_word = |at: usize| {
                let before = script[..at].chars().next_back();
                let after = script[at + name.len()..].chars().next();
                let part =
                    |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
                !part(before) && !part(after)
            };
            let left = script
                .match_indices(name.as_str())
                .any(|(at, _)| as_word(at));
            assert!(!left, "{name} is left in a script");
        }
    }
    assert_eq!(
        inline("a = OP_REFUND .. OP_REFUNDS + SET_N - PACK_WIDE_DENIED"),
        r#"a = "r" .. OP_REFUNDS + 5 - (-1)"#
    );
    // Only code: comments and string literals are left as written.
    assert_eq!(
        inline("a = SET_N -- SET_N, \"SET_N\"\nb = 'SET_N' .. \"x\\\"SET_N\" .. SET_N"),
        "a = 5 -- SET_N, \"SET_N\"\nb = 'SET_N' .. \"x\\\"SET_N\" .. 5"
    );
    assert_eq!(
        inline("--[==[ SET_N ]] SET_N ]==] SET_N [[ SET_N ]] t[SET_N]"),
        "--[==[ SET_N ]] SET_N ]==] 5 [[ SET_N ]] t[5]"
    );
    // The pieces join to the whole.
    let library = Library::get().source();
    let joined: String = lua_spans(library)
        .into_iter()
        .map(|(_, text)| text)
        .collect();
    assert_eq!(joined, library);
    // Values are plain: nothing to escape in a Lua string.
    for (name, value) in constants() {
        if let Lua::Str(text) = value {
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\'),
                "{name}"
            );
        }
    }
}

/// What a trace step does, for the charge's round trip.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check,
    Refund,
    Charge,
}

/// The model's state as the Lua keeps it: the same numbers, or for a sliding log the
/// same stamps in a ring of as many (it may be turned in another place).
fn same_state(policy: &Policy, model: Option<&State>, raw: Option<&[u8]>) -> bool {
    match (model, raw) {
        (None, None) => true,
        (Some(State::SlidingLog { stamps }), Some(raw)) => {
            raw.len() == 4 + 6 * stamps.len() && super::state::decode(policy, raw).as_ref() == model
        }
        (Some(_), Some(raw)) => super::state::decode(policy, raw).as_ref() == model,
        _ => false,
    }
}

#[tokio::test]
async fn a_charge_round_trips_and_writes_the_model_s_state() {
    use crate::algorithm::{self, charge_units};
    let server = Server::start();
    let mut conn = server.conn().await;
    let ms = Duration::from_millis;
    #[allow(unused_mut)]
    let mut sets: Vec<Arc<[Policy]>> = vec![
        policies(),
        vec![Policy::sliding_window("sw", 10, ms(1_000)).unwrap()].into(),
        vec![Policy::sliding_log("sl", 4, ms(1_000)).unwrap()].into(),
        vec![
            Policy::fixed_window("fw", 6, ms(500)).unwrap(),
            Policy::sliding_log("sl", 3, ms(1_000)).unwrap().shadow(),
        ]
        .into(),
        // A joint key whose first state outgrows a one-byte length.
        vec![
            Policy::sliding_log("sl", 60, ms(1_000)).unwrap(),
            Policy::fixed_window("fw", 6, ms(500)).unwrap(),
        ]
        .into(),
    ];
    // Days from 01:00 UTC: the steps cross into the next day at 3 600 000 ms, and the
    // clock that goes back after stays in it (the Lua given the earlier day's end).
    #[cfg(feature = "calendar")]
    {
        use crate::policy::Period;
        let day = || Policy::calendar("cq", 6, Period::Day, "Etc/GMT+1", 1).unwrap();
        sets.push(vec![day()].into());
        sets.push(
            vec![
                Policy::fixed_window("fw", 6, ms(500)).unwrap(),
                day().shadow(),
            ]
            .into(),
        );
    }
    // (time, what, cost): charges fresh, past the limit, huge, after a refund, with
    // the clock gone back, and on foreign state far ahead.
    let steps: [(u64, Op, u64); 9] = [
        (NOW, Op::Charge, 3),
        (NOW, Op::Check, 2),
        (NOW + 10, Op::Charge, 25),
        (NOW + 20, Op::Refund, 2),
        (NOW + 300, Op::Charge, u64::MAX),
        (NOW + 1_200, Op::Charge, 1),
        (NOW + 700, Op::Charge, 4),
        (NOW + 9_000_000, Op::Check, 1),
        (NOW + 9_000, Op::Charge, 2),
    ];
    for via in VIAS {
        for (s, p) in sets.iter().enumerate() {
            let base = format!("rt:{{charge-{via:?}-{s}}}:t:");
            // A set of one policy keeps its key, a set of two their joint key.
            let joint = p.len() > 1;
            let keys: Vec<String> = if joint {
                vec![format!("{base}~")]
            } else {
                let mut key = base.clone();
                crate::store::redis::keys::push_policy_suffix(&mut key, &p[0]);
                vec![key]
            };
            let mut model: Vec<Option<State>> = vec![None; p.len()];
            for (i, &(at, op, cost)) in steps.iter().enumerate() {
                let what = format!("{via:?} set {s} step {i} ({op:?} {cost} at {at})");
                let cost = match op {
                    Op::Charge => charge_units(p, cost),
                    _ => cost.min(p.iter().map(Policy::max_cost).min().unwrap()),
                };
                let shape = match op {
                    Op::Check => None,
                    Op::Refund => Some(Operation::Refund),
                    Op::Charge => Some(Operation::Charge),
                };
                let mut ttls = vec![0; p.len()];
                let expected: Vec<PolicyReply> = match op {
                    Op::Check => {
                        let (outcomes, _) = algorithm::decide_all(p, &mut model, at, cost);
                        outcomes
                            .iter()
                            .map(|o| {
                                outcome(o.allowed, o.remaining, o.reset_after_ms, o.retry_after_ms)
                            })
                            .collect()
                    }
                    Op::Refund | Op::Charge => p
                        .iter()
                        .zip(model.iter_mut())
                        .zip(ttls.iter_mut())
                        .map(|((policy, state), ttl)| {
                            let peek = if let Op::Charge = op {
                                if let Some((next, keep)) =
                                    algorithm::charge(policy, state.as_ref(), at, cost)
                                {
                                    *state = Some(next);
                                    *ttl = keep;
                                }
                                1
                            } else {
                                if let Some(next) =
                                    algorithm::refund(policy, state.as_ref(), at, cost)
                                {
                                    *state = Some(next);
                                }
                                cost
                            };
                            let o = algorithm::decide(policy, state.as_ref(), at, peek).outcome;
                            outcome(o.allowed, o.remaining, o.reset_after_ms, o.retry_after_ms)
                        })
                        .collect(),
                };
                let reply = match shape {
                    None => {
                        let mut c = call(&base, p, cost, CHECK);
                        c.now_ms = Some(at);
                        round_trip(&mut conn, &c, via).await
                    }
                    Some(admin) => {
                        let mut c = call(&base, p, cost, Run(admin));
                        c.now_ms = Some(at);
                        round_trip(&mut conn, &c, via).await
                    }
                };
                assert_eq!(reply.0.as_slice(), expected.as_slice(), "{what}");
                for key in &keys {
                    if let Op::Charge = op {
                        // Written with the model's TTL (Redis counts it in real time):
                        // a joint key's is the longest of its states'.
                        let pttl: i64 = redis::cmd("PTTL")
                            .arg(key)
                            .query_async(&mut conn)
                            .await
                            .unwrap();
                        let ttl = i64::try_from(ttls.iter().copied().max().unwrap()).unwrap();
                        assert!(
                            pttl <= ttl && pttl > ttl - 1_000,
                            "{what}: {key}: {pttl} of {ttl}"
                        );
                    }
                    // Then kept as long as the model keeps it: Redis counts TTLs in
                    // real time, the trace runs on its own clock.
                    let _: i64 = redis::cmd("PEXPIRE")
                        .arg(key)
                        .arg(600_000)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
                let key = &keys[0];
                let raw: Option<Vec<u8>> = redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let parts = match (&raw, joint) {
                    (Some(raw), true) => super::state::joint_parts(raw, p.len()),
                    (raw, _) => vec![raw.as_deref()],
                };
                for (j, policy) in p.iter().enumerate() {
                    assert!(
                        same_state(policy, model[j].as_ref(), parts[j]),
                        "{what}: {key}: the model's {:?}, Redis {:?}",
                        model[j],
                        parts[j].map(String::from_utf8_lossy)
                    );
                }
            }
        }
    }
}

#[test]
fn every_operation_has_a_letter_and_a_lua_name_of_its_own() {
    let letters: std::collections::HashSet<&str> =
        super::Op::ALL.iter().map(|op| op.letter()).collect();
    let names: std::collections::HashSet<String> =
        super::Op::ALL.iter().map(|op| op.lua_name()).collect();
    assert_eq!(letters.len(), super::Op::ALL.len());
    assert_eq!(names.len(), super::Op::ALL.len());
    assert!(names.contains("OP_GIVE_BACK") && names.contains("OP_CHECK"));
}

/// A calendar quota's Lua decides with its own now, given the period's end the store
/// computed on another clock: a stored end ahead of it (by at most MAX_CLOCK_BACK
/// days) is the period counted; a now at or past it decides as at the period's last
/// millisecond (a reset of 1 ms), whatever the state.
#[tokio::test]
async fn a_calendar_quota_s_lua_is_total_when_the_clocks_disagree() {
    use crate::algorithm::calendar::MAX_AHEAD_MS;
    let server = Server::start();
    let mut conn = server.conn().await;
    let day = 86_400_000u64;
    let end = 20_000 * day;
    let key = "rt:{calendar}:t:q:cq";
    // A batch of one check on the client's clock, its cost given, the period's end
    // given as the set's n.
    let check = |cost: u64, given_end: u64, now: u64| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(Library::get().function(Entry::Check))
            .arg(1)
            .arg(key)
            .arg(
                [
                    &[HEAD_CLIENT_CLOCK, FLAGS_BASE | FLAG_COSTS, 1][..],
                    format!("{}:3:{given_end};", code(Algorithm::Calendar)).as_bytes(),
                ]
                .concat(),
            )
            .arg(&[1u8][..])
            .arg(cost)
            .arg(now);
        cmd
    };
    // The state as the Lua packs it: the period's end and its count.
    let set = |(end, count): (u64, u64)| {
        let mut raw = end.to_be_bytes()[2..].to_vec();
        raw.extend_from_slice(&count.to_be_bytes()[2..]);
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(raw).arg("PX").arg(60_000);
        cmd
    };
    let reply = |value: Value| decode::<Reply>(value).unwrap().0[0];
    for now in [end, end + 1, end + 10 * day] {
        let _: () = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let fresh = reply(check(1, end, now).query_async(&mut conn).await.unwrap());
        assert_eq!(fresh, outcome(true, 2, 1, 0), "now {now}");
        let _: () = set((end, 3)).query_async(&mut conn).await.unwrap();
        let full = reply(check(1, end, now).query_async(&mut conn).await.unwrap());
        assert_eq!(full, outcome(false, 0, 1, 1), "now {now}");
    }
    // The stored period a day ahead of the one given: counted in, waited out.
    let ahead = end + day;
    let _: () = set((ahead, 3)).query_async(&mut conn).await.unwrap();
    // A minute before the period's end: the state written below lives until that end
    // on this clock, which leaves the read that follows it a minute on a busy machine
    // (5 ms did not, beside busy loops).
    let now = end - 60_000;
    let r = reply(check(1, end, now).query_async(&mut conn).await.unwrap());
    assert_eq!(r, outcome(false, 0, ahead - now, ahead - now));
    // Further ahead than MAX_CLOCK_BACK days: foreign, read as fresh.
    let far = end + MAX_AHEAD_MS + 1;
    let _: () = set((far, 3)).query_async(&mut conn).await.unwrap();
    let r = reply(check(1, end, now).query_async(&mut conn).await.unwrap());
    assert_eq!(r, outcome(true, 2, end - now, 0));
    // A stored period behind the one given is over: fresh.
    let _: () = set((end - day, 3)).query_async(&mut conn).await.unwrap();
    let r = reply(check(2, end, now).query_async(&mut conn).await.unwrap());
    assert_eq!(r, outcome(true, 1, end - now, 0));
    let kept: Vec<u8> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let quota = Policy::calendar("q", 3, crate::policy::Period::Day, "UTC", 1).unwrap();
    assert_eq!(
        super::state::render(&quota, &kept).as_deref(),
        Some(format!("{end}:2").as_str())
    );
}

/// In flight, Lua and model side by side: three holders (instances) check, release
/// and renew one subject's slots at random, the clock moving on by up to two slot
/// lifetimes a step or back by up to one; every reply and every state (read back
/// from the Lua's layout) is the model's. The Lua reads a header and finds its own
/// entry while nothing can have expired or come from a clock ahead, and reads every
/// entry otherwise: the steps cross both paths, both layouts, and holders leaving and
/// coming back.
#[tokio::test]
async fn in_flight_matches_the_model_on_random_steps() {
    use crate::algorithm::in_flight::Hold;
    use crate::algorithm::{self, State};
    let server = Server::start();
    let mut conn = server.conn().await;
    let ttl = Duration::from_millis(300);
    let holders: Vec<Arc<[Policy]>> = [0x0a_u64, 0xbbbb_cccc_dddd, 0xffff_ffff_ffff]
        .into_iter()
        .map(|id| vec![Policy::in_flight("running", 4, ttl).unwrap().held_by(id)].into())
        .collect();
    let base = "rt:{in-flight}:t:";
    let key = format!("{base}running:if");
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut model: Option<State> = None;
    let mut now = 1_000_000u64;
    let mut paths = [0usize; 3];
    let mut layouts = std::collections::BTreeSet::new();
    for step in 0..600 {
        now = match next(10) {
            0 => now + next(600),
            1 => now.saturating_sub(next(300)),
            _ => now + next(40),
        };
        let who = usize::try_from(next(3)).unwrap();
        let p = &holders[who];
        let (op, cost) = match next(6) {
            0..=2 => (Operation::Check, 1),
            3 | 4 => (Operation::Release, 1),
            _ => (Operation::Renew, next(3)),
        };
        paths[match op {
            Operation::Check => 0,
            Operation::Release => 1,
            _ => 2,
        }] += 1;
        let expected = match op {
            Operation::Check => {
                let step = algorithm::decide(&p[0], model.as_ref(), now, 1);
                if let Some(commit) = step.commit {
                    commit.apply(&mut model);
                }
                step.outcome
            }
            _ => {
                let change = match op {
                    Operation::Release => Hold::Release,
                    _ => Hold::Renew { held: cost },
                };
                algorithm::hold(&p[0], &mut model, now, change);
                algorithm::decide(&p[0], model.as_ref(), now, 1).outcome
            }
        };
        let mut c = call(base, p, cost, Run(op));
        c.now_ms = Some(now);
        let reply = round_trip(&mut conn, &c, Via::Function).await;
        let what = format!("step {step}: holder {who} {op:?} {cost} at {now}");
        assert_eq!(
            reply.0.as_slice(),
            [outcome(
                expected.allowed,
                expected.remaining,
                expected.reset_after_ms,
                expected.retry_after_ms
            )],
            "{what}"
        );
        let raw: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        // The model keeps what it read until the next write; the Lua drops the dead
        // entries whenever it writes: the same live entries either way.
        let live = |state: Option<State>| match state {
            Some(State::InFlight { holders }) => holders
                .into_iter()
                .filter(|h| h.expires_ms > now && h.count > 0)
                .collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        let stored = raw
            .as_deref()
            .and_then(|raw| super::state::decode(&p[0], raw));
        // 0: no state; 1: one holder, one slot; 10 + n: a header and n entries.
        layouts.insert(raw.as_ref().map_or(0, |raw| match raw.len() {
            12 => 1,
            len => 10 + (len - 18) / 17,
        }));
        assert_eq!(live(stored), live(model.clone()), "{what}: {raw:?}");
        // Kept as the model keeps it: Redis counts the TTL in real time.
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(&key)
            .arg(600_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    assert!(paths.iter().all(|&n| n > 50), "{paths:?}");
    // No state, one holder with one slot (12 bytes), and a header with 1 to 3 entries.
    assert_eq!(layouts.len(), 5, "{layouts:?}");
}
