//! In-flight policies: the memory store and the Lua hold slots alike; the layer holds
//! a slot from admission until the response body ends, is dropped mid-stream or the
//! handler panics; instances share one count through Redis; a vanished instance's
//! slots free themselves one slot lifetime after its last renewal, and a flushed
//! store gets its counts back at the next renewal.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use redlimit::clock::Clock;
use redlimit::clock::FakeClock;
use redlimit::internals::{AdminStore, Backend, LimiterInternals, Operation, PolicySet};
use redlimit::layer::ResponseBody;
use redlimit::store::StoreErrorKind;
use redlimit::{
    Decision, Limiter, MemoryStore, Origin, Permit, Policy, RateLimitLayer, RedisStore, Subject,
};
use tokio::sync::mpsc;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::support::layer::{body_text, header, request, UserHeader, RATELIMIT_POLICY};
use crate::support::props::Lcg;
use crate::support::RedisServer;

const SLOT_TTL: Duration = Duration::from_secs(30);

fn in_flight(limit: u32) -> Policy {
    Policy::in_flight("running", limit, SLOT_TTL).unwrap()
}

fn redis_store(server: &RedisServer, clock: &FakeClock) -> RedisStore {
    server
        .store()
        .client_clock(clock.clone())
        .timeout(Duration::from_secs(5))
}

/// The parts of a decision both stores must agree on.
#[allow(clippy::type_complexity)]
fn seen(
    d: &Decision,
) -> (
    bool,
    u64,
    u64,
    Option<Duration>,
    String,
    Option<Vec<redlimit::PolicyOutcome>>,
) {
    (
        d.is_allowed(),
        d.remaining(),
        d.outcome().reset_after_ms,
        d.retry_after(),
        d.policy().name().to_owned(),
        // Every policy's, for the admin operations' answers.
        d.each_policy().map(<[_]>::to_vec),
    )
}

#[tokio::test]
async fn memory_and_redis_hold_slots_alike_for_two_holders() {
    let server = RedisServer::start();
    let sets: [Vec<Policy>; 3] = [
        vec![in_flight(3)],
        vec![
            in_flight(2),
            Policy::fixed_window("rate", 5, Duration::from_secs(60)).unwrap(),
        ],
        vec![
            Policy::sliding_window("rate", 4, Duration::from_secs(60)).unwrap(),
            in_flight(2).shadow(),
        ],
    ];
    for (n, policies) in sets.iter().enumerate() {
        // Two instances: two sets of the same policies, each its own holder; the
        // memory store and Redis get the very same sets.
        let holders: Vec<PolicySet> = (0..2)
            .map(|_| {
                let limiter = policies
                    .iter()
                    .cloned()
                    .fold(Limiter::builder(MemoryStore::new()), |b, p| b.policy(p))
                    .build()
                    .unwrap();
                limiter.policy_set().clone()
            })
            .collect();
        let clock = FakeClock::new(1_700_000_000_000);
        let memory = MemoryStore::with_clock(clock.clone());
        let redis = redis_store(&server, &clock);
        let subject = Subject::new(format!("in-flight-{n}"));
        let mut rng = Lcg(n as u64 + 7);
        let mut admitted = 0;
        for step in 0..300 {
            let set = &holders[rng.below(2) as usize];
            let (op, cost) = match rng.below(10) {
                0..=3 => (Operation::Check, 1 + rng.below(3)),
                4..=5 => (Operation::Release, 1),
                6 => (Operation::Renew, rng.below(4)),
                7 => (Operation::Peek, 1),
                8 => (Operation::Refund, 1),
                _ => {
                    // Up to a third of a slot lifetime, so entries expire now and then.
                    clock.advance(Duration::from_millis(rng.below(12_000)));
                    continue;
                }
            };
            let (m, r) = if op == Operation::Check {
                (
                    memory.check(subject.clone(), set, cost).await,
                    redis.check(subject.clone(), set, cost).await,
                )
            } else {
                (
                    memory.run(op, subject.clone(), set, cost).await,
                    redis.run(op, subject.clone(), set, cost).await,
                )
            };
            let (m, r) = (m.unwrap(), r.unwrap());
            assert_eq!(seen(&m), seen(&r), "set {n}, step {step}: {op:?} {cost}");
            if op == Operation::Check && m.is_allowed() {
                admitted += 1;
            }
        }
        assert!(admitted >= 10, "set {n}: only {admitted} admitted");
    }
}

/// The handlers' side of the requests the tests hold open: each handler's body is fed
/// through a channel whose sender the test takes.
/// The handlers' senders, by the number each response carries in `x-feed`.
#[derive(Clone, Default)]
struct Bodies(Arc<Mutex<Vec<Option<mpsc::Sender<Bytes>>>>>);

impl Bodies {
    /// The sender of `response`'s body.
    fn of(&self, response: &Answer) -> mpsc::Sender<Bytes> {
        let feed: usize = header(response.headers(), "x-feed")
            .unwrap()
            .parse()
            .unwrap();
        self.0.lock().unwrap()[feed].take().unwrap()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    async fn handler(self, _req: Request<Empty<Bytes>>) -> Result<Response<Fed>, Infallible> {
        let (tx, rx) = mpsc::channel(4);
        let mut feeds = self.0.lock().unwrap();
        feeds.push(Some(tx));
        let mut response = Response::new(Fed(rx));
        response
            .headers_mut()
            .insert("x-feed", (feeds.len() - 1).into());
        Ok(response)
    }
}

/// A body fed through a channel: it ends when its sender is dropped.
struct Fed(mpsc::Receiver<Bytes>);

impl Body for Fed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

type Answer = Response<ResponseBody<Fed>>;

/// Sends `n` requests of `user` at once through `services` in turn, and sorts the
/// answers: the allowed responses (bodies still open) and the bodies of the refused.
async fn at_once<T>(services: &[T], user: &str, n: usize) -> (Vec<Answer>, Vec<String>)
where
    T: Service<Request<Empty<Bytes>>, Response = Answer, Error = Infallible>
        + Clone
        + Send
        + 'static,
    T::Future: Send,
{
    let handles: Vec<_> = (0..n)
        .map(|i| tokio::spawn(services[i % services.len()].clone().oneshot(request(user))))
        .collect();
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for handle in handles {
        let response = handle.await.unwrap().unwrap();
        if response.status() == StatusCode::OK {
            ok.push(response);
        } else {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(header(response.headers(), "retry-after"), Some("1"));
            refused.push(body_text(response).await);
        }
    }
    (ok, refused)
}

/// The number of `user`'s requests in flight, as a check of `limiter` would see it.
async fn in_flight_now<S: redlimit::store::Store>(
    limiter: &Limiter<S>,
    user: &str,
    limit: u64,
) -> u64 {
    let peek = limiter.peek(user, 1).await.unwrap();
    if peek.is_allowed() {
        limit - 1 - peek.remaining()
    } else {
        limit
    }
}

/// Waits (a bounded number of turns of the runtime, no sleep) until `user` has
/// `expected` requests in flight: a release to Redis runs as a task of its own, off
/// the response's path.
async fn settles_to<S: redlimit::store::Store>(
    limiter: &Limiter<S>,
    user: &str,
    limit: u64,
    expected: u64,
) {
    for _ in 0..100 {
        if in_flight_now(limiter, user, limit).await == expected {
            return;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(in_flight_now(limiter, user, limit).await, expected);
}

/// Three slots, four requests: three pass and hold their slots until their bodies end
/// one way or another (to the end, dropped mid-stream, dropped unread), the fourth is
/// refused with a body that says which limit and a `Retry-After` hint of 1 s.
async fn three_of_four_then_every_slot_comes_back<S>(limiters: Vec<Arc<Limiter<S>>>)
where
    S: redlimit::store::Store + Sync,
{
    let bodies = Bodies::default();
    let services: Vec<_> = limiters
        .iter()
        .map(|limiter| {
            let bodies = bodies.clone();
            ServiceBuilder::new()
                .layer(RateLimitLayer::from_shared(Arc::clone(limiter), UserHeader))
                .service_fn(move |req| bodies.clone().handler(req))
        })
        .collect();
    let (mut ok, refused) = at_once(&services, "alice", 4).await;
    assert_eq!((ok.len(), refused.len()), (3, 1));
    assert_eq!(
        refused[0],
        "Too Many Requests: in-flight limit 'running' reached: 3 requests already running; retry after 1 s"
    );
    assert_eq!(
        header(ok[0].headers(), RATELIMIT_POLICY),
        Some(r#""running";q=3;qu="concurrent-requests""#)
    );
    assert_eq!(in_flight_now(&limiters[0], "alice", 3).await, 3);
    assert_eq!(bodies.len(), 3);

    // One to its end.
    let first = ok.remove(0);
    let feed = bodies.of(&first);
    feed.send(Bytes::from_static(b"chunk")).await.unwrap();
    drop(feed);
    assert_eq!(
        first.into_body().collect().await.unwrap().to_bytes(),
        "chunk"
    );
    settles_to(&limiters[0], "alice", 3, 2).await;

    // One dropped mid-stream: the client went away after a chunk.
    let second = ok.remove(0);
    let feed = bodies.of(&second);
    let mut second = second.into_body();
    feed.send(Bytes::from_static(b"chunk")).await.unwrap();
    let chunk = second.frame().await.unwrap().unwrap();
    assert_eq!(chunk.into_data().unwrap(), "chunk");
    drop(second);
    settles_to(&limiters[0], "alice", 3, 1).await;

    // One dropped before a byte was read; its handler could still feed it.
    let third = ok.remove(0);
    let _feed = bodies.of(&third);
    drop(third);
    settles_to(&limiters[0], "alice", 3, 0).await;
    for limiter in &limiters {
        assert_eq!(limiter.held_slots(&Subject::new("alice")), 0);
    }

    // Every slot is back: three run at once again.
    let (ok, refused) = at_once(&services, "alice", 3).await;
    assert_eq!((ok.len(), refused.len()), (3, 0));
}

#[tokio::test]
async fn memory_store_three_of_four_then_every_slot_comes_back() {
    let limiter = Arc::new(Limiter::new(MemoryStore::new(), in_flight(3)));
    three_of_four_then_every_slot_comes_back(vec![limiter]).await;
}

#[tokio::test]
async fn two_instances_on_one_redis_share_three_slots() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let instances = (0..2)
        .map(|_| Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(3))))
        .collect();
    three_of_four_then_every_slot_comes_back(instances).await;
    server.assert_every_key_expires().await;
}

/// A handler that panics: its slot is released as the future unwinds, on both stores.
#[tokio::test]
async fn a_handler_that_panics_gives_its_slot_back() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let memory = Arc::new(Limiter::new(MemoryStore::new(), in_flight(1)));
    let redis = Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(1)));
    async fn panics(_req: Request<Empty<Bytes>>) -> Result<Response<Empty<Bytes>>, Infallible> {
        panic!("the handler failed");
    }
    async fn check_twice<S: redlimit::store::Store + Sync>(limiter: Arc<Limiter<S>>) {
        for _ in 0..2 {
            let service = ServiceBuilder::new()
                .layer(RateLimitLayer::from_shared(
                    Arc::clone(&limiter),
                    UserHeader,
                ))
                .service_fn(panics);
            let joined = tokio::spawn(service.oneshot(request("bob"))).await;
            assert!(joined.unwrap_err().is_panic());
            settles_to(&limiter, "bob", 1, 0).await;
        }
    }
    check_twice(memory).await;
    check_twice(redis).await;
}

/// Instance A takes three slots and renews them once, then vanishes (its slots are
/// never released, never renewed again). Instance B is refused until one slot
/// lifetime after A's last renewal, to the millisecond, then admitted.
#[tokio::test]
async fn a_vanished_instance_s_slots_free_themselves_one_lifetime_after_its_last_renewal() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let a = Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(3)));
    let b = Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(3)));
    let mut slots = Vec::new();
    for _ in 0..3 {
        let decision = a.check("carol", 1).await.unwrap();
        slots.push(a.hold("carol", &decision).unwrap());
    }
    clock.advance(Duration::from_secs(10));
    assert_eq!(a.renew_slots().await, 1);
    let last_renewal = clock.now_ms();
    // Killed: nothing of A runs any more, and its slots are never given back.
    std::mem::forget(slots);
    clock.advance(SLOT_TTL - Duration::from_millis(1));
    let refused = b.check("carol", 1).await.unwrap();
    assert!(!refused.is_allowed());
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(1)));
    clock.set_ms(last_renewal + SLOT_TTL.as_millis() as u64);
    let admitted = b.check("carol", 1).await.unwrap();
    assert!(admitted.is_allowed(), "{admitted:?}");
    assert_eq!(admitted.remaining(), 2);
}

/// The store loses every count (a flush, a failover to an empty replica): the holders'
/// next renewal writes them back, so the over-admission lasts one renewal interval.
#[tokio::test]
async fn after_a_flush_the_next_renewal_restores_the_counts() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let a = Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(2)));
    let b = Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(2)));
    let d = a.check("dave", 1).await.unwrap();
    let _one = a.hold("dave", &d).unwrap();
    let d = b.check("dave", 1).await.unwrap();
    let _two = b.hold("dave", &d).unwrap();
    assert!(!b.check("dave", 1).await.unwrap().is_allowed());
    let mut conn = server.conn().await;
    let () = redlimit::redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Lost: one too many is admitted (unheld, it frees itself in a lifetime).
    assert!(b.check("dave", 1).await.unwrap().is_allowed());
    assert_eq!(a.renew_slots().await, 1);
    assert_eq!(b.renew_slots().await, 1);
    // Each holder wrote back what it holds: two running, none free.
    let refused = b.check("dave", 1).await.unwrap();
    assert!(!refused.is_allowed(), "{refused:?}");
}

/// A clock that follows tokio's (paused) time, so the memory store's slots age as the
/// renewal task's timer runs.
#[derive(Debug)]
struct TokioClock(tokio::time::Instant);

impl redlimit::clock::Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        1_000_000 + self.0.elapsed().as_millis() as u64
    }
}

#[tokio::test(start_paused = true)]
async fn held_slots_are_renewed_past_their_lifetime_and_the_renewal_stops_when_none_are_held() {
    let store = MemoryStore::with_clock(TokioClock(tokio::time::Instant::now()));
    let policy = Policy::in_flight("running", 1, Duration::from_secs(3)).unwrap();
    let a = Arc::new(Limiter::new(store.clone(), policy.clone()));
    let b = Limiter::new(store, policy);
    let d = a.check("erin", 1).await.unwrap();
    let slot = a.hold("erin", &d).unwrap();
    // Ten lifetimes: renewed every second, it never frees itself.
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!b.check("erin", 1).await.unwrap().is_allowed());
    }
    drop(slot);
    assert!(b.check("erin", 1).await.unwrap().is_allowed());
    // The renewal task ends with nothing held, at its next round.
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    assert_eq!(tasks(), 1, "the renewal task");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(tasks(), 0);
}

/// A request refused by either the rate or the slots takes nothing from the other.
#[tokio::test]
async fn slots_and_rates_are_all_or_nothing() {
    let limiter = Arc::new(
        Limiter::builder(MemoryStore::with_clock(FakeClock::new(1_000_000)))
            .policy(Policy::fixed_window("rate", 2, Duration::from_secs(60)).unwrap())
            .policy(in_flight(1))
            .build()
            .unwrap(),
    );
    let first = limiter.check("f", 1).await.unwrap();
    let slot = limiter.hold("f", &first).unwrap();
    // No slot: refused by the in-flight policy, and the rate keeps its unit.
    let refused = limiter.check("f", 1).await.unwrap();
    assert_eq!(refused.denied_by(), Some("running"));
    drop(slot);
    let second = limiter.check("f", 1).await.unwrap();
    assert!(second.is_allowed());
    let peek = limiter.peek("f", 1).await.unwrap();
    let each = peek.each_policy().unwrap();
    assert_eq!(
        (each[0].allowed, each[0].remaining),
        (false, 0),
        "rate: two taken"
    );
    // Second's slot is unheld (nobody holds it): refused by the rate now, which takes
    // no slot either: still the one.
    let by_rate = limiter.check("f", 1).await.unwrap();
    assert_eq!(by_rate.denied_by(), Some("rate"));
    assert!(!limiter.peek("f", 1).await.unwrap().each_policy().unwrap()[1].allowed);
}

/// A slot freed on this instance is seen at once: an in-flight denial is never kept in
/// the block cache (a rate's denial is, until its time).
#[tokio::test]
async fn an_in_flight_denial_is_never_kept_by_the_block_cache() {
    let limiter = Arc::new(
        Limiter::builder(MemoryStore::new())
            .policy(in_flight(1))
            .block_cache(100)
            .build()
            .unwrap(),
    );
    let first = limiter.check("g", 1).await.unwrap();
    let slot = limiter.hold("g", &first).unwrap();
    assert!(!limiter.check("g", 1).await.unwrap().is_allowed());
    drop(slot);
    assert!(limiter.check("g", 1).await.unwrap().is_allowed());
}

/// While the store fails, the fallback takes and gives back the slots, and a slot it
/// took is given back there, never to the store.
#[tokio::test]
async fn while_the_store_fails_the_fallback_holds_the_slots() {
    let limiter = Arc::new(
        Limiter::builder(crate::support::layer::BrokenStore)
            .policy(in_flight(1))
            .fallback(MemoryStore::new())
            .build()
            .unwrap(),
    );
    let first = limiter.check("h", 1).await.unwrap();
    assert_eq!(first.origin(), redlimit::Origin::Fallback);
    let slot = limiter.hold("h", &first).unwrap();
    assert_eq!(limiter.held_slots(&Subject::new("h")), 1);
    assert!(!limiter.check("h", 1).await.unwrap().is_allowed());
    drop(slot);
    assert_eq!(limiter.held_slots(&Subject::new("h")), 0);
    assert!(limiter.check("h", 1).await.unwrap().is_allowed());
}

/// A policy whose limit changes under the same name counts the same slots: the
/// instances of the new limit see the old one's running (never a flood), and the old
/// one's slots free as they end (never a lockout).
#[tokio::test]
async fn a_policy_whose_limit_changes_counts_the_same_slots() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let old = Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(2)));
    let new = Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(3)));
    let mut slots = Vec::new();
    for _ in 0..2 {
        let d = old.check("i", 1).await.unwrap();
        slots.push(old.hold("i", &d).unwrap());
    }
    assert!(!old.check("i", 1).await.unwrap().is_allowed());
    // The new limit sees the two running: one more may start.
    let d = new.check("i", 1).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    slots.push(new.hold("i", &d).unwrap());
    assert!(!new.check("i", 1).await.unwrap().is_allowed());
    drop(slots);
    settles_to(&old, "i", 2, 0).await;
    settles_to(&new, "i", 3, 0).await;
}

/// Instances whose clocks disagree: the slots of one whose clock runs ahead by less
/// than the foreign bound count on the other's clock until they expire there (its lead
/// longer); one further ahead than five slot lifetimes is foreign, and its slots do not
/// count (at most `limit` more start), never a lockout.
#[tokio::test]
async fn slots_written_by_a_clock_ahead_count_its_lead_longer_or_are_foreign() {
    let server = RedisServer::start();
    let t0 = 1_700_000_000_000;
    let lead = Duration::from_secs(10);
    let (behind, ahead) = (
        FakeClock::new(t0),
        FakeClock::new(t0 + lead.as_millis() as u64),
    );
    let a = Arc::new(Limiter::new(redis_store(&server, &ahead), in_flight(1)));
    let b = Arc::new(Limiter::new(redis_store(&server, &behind), in_flight(1)));
    let d = a.check("j", 1).await.unwrap();
    std::mem::forget(a.hold("j", &d).unwrap());
    let until = t0 + (lead + SLOT_TTL).as_millis() as u64;
    behind.set_ms(until - 1);
    assert!(!b.check("j", 1).await.unwrap().is_allowed());
    behind.set_ms(until);
    assert!(b.check("j", 1).await.unwrap().is_allowed());

    // Ahead by more than five slot lifetimes: state this clock cannot have written.
    let far = FakeClock::new(t0 + 6 * SLOT_TTL.as_millis() as u64);
    let c = Arc::new(Limiter::new(redis_store(&server, &far), in_flight(1)));
    let d = c.check("k", 1).await.unwrap();
    std::mem::forget(c.hold("k", &d).unwrap());
    behind.set_ms(t0);
    let admitted = b.check("k", 1).await.unwrap();
    assert!(admitted.is_allowed(), "{admitted:?}");
    assert!(!b.check("k", 1).await.unwrap().is_allowed());
}

/// A Redis store on `server` with a timeout short enough for a test to wait it out.
fn quick_store(server: &RedisServer, clock: &FakeClock) -> RedisStore {
    server
        .store()
        .client_clock(clock.clone())
        .timeout(Duration::from_millis(300))
}

/// Waits until `limiter`'s store answers again (it reconnects in the background, with
/// backoff): a peek the store decides, not the fallback. Bounded by total time.
async fn store_answers_again<S: redlimit::store::Store>(limiter: &Limiter<S>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(d) = limiter.peek("probe", 1).await {
            if d.origin() == Origin::Store {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store did not answer again within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until a check of `user` by `limiter` would see `expected` in flight, a call to
/// another connection (so no order with the calls it waits for): bounded by total time.
async fn seen_within<S: redlimit::store::Store>(
    limiter: &Limiter<S>,
    user: &str,
    limit: u64,
    expected: u64,
    bound: Duration,
    why: &str,
) {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let now = in_flight_now(limiter, user, limit).await;
        if now == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{user}: {now} in flight after {bound:?}, not {expected}: {why}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Instance A takes three slots in its fallback while Redis is down; once Redis
/// answers again, A's next renewal writes them there, so instance B, which only has
/// Redis, sees all three and is refused (it admitted three more before: 6 running
/// against a limit of 3). A's releases then free them in Redis.
#[tokio::test]
async fn slots_the_fallback_took_are_counted_in_redis_once_it_answers_again() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let a = Arc::new(
        Limiter::builder(quick_store(&server, &clock))
            .policy(in_flight(3))
            .fallback(MemoryStore::with_clock(clock.clone()))
            .build()
            .unwrap(),
    );
    let b = Arc::new(Limiter::new(quick_store(&server, &clock), in_flight(3)));
    assert_eq!(a.peek("m", 1).await.unwrap().origin(), Origin::Store);
    b.peek("m", 1).await.unwrap();
    server.stop();
    let mut slots = Vec::new();
    for _ in 0..3 {
        let d = a.check("m", 1).await.unwrap();
        assert_eq!(d.origin(), Origin::Fallback, "{d:?}");
        slots.push(a.hold("m", &d).unwrap());
    }
    assert!(!a.check("m", 1).await.unwrap().is_allowed());
    server.restart();
    store_answers_again(&a).await;
    store_answers_again(&b).await;
    // Control: the restarted Redis knows nothing of A's slots yet.
    assert_eq!(in_flight_now(&b, "m", 3).await, 0);
    assert_eq!(a.renew_slots().await, 1);
    assert_eq!(in_flight_now(&b, "m", 3).await, 3);
    let refused = b.check("m", 1).await.unwrap();
    assert!(!refused.is_allowed(), "{refused:?}");
    // Counted in Redis now: each release frees its slot there.
    drop(slots.pop());
    settles_to(&b, "m", 3, 2).await;
    let d = b.check("m", 1).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    let _b_slot = b.hold("m", &d).unwrap();
    assert!(!b.check("m", 1).await.unwrap().is_allowed());
    // Another round changes nothing: A holds two, B one.
    assert_eq!(a.renew_slots().await, 1);
    assert_eq!(in_flight_now(&b, "m", 3).await, 3);
    drop(slots);
    settles_to(&b, "m", 3, 1).await;
    assert_eq!(a.held_slots(&Subject::new("m")), 0);
}

/// A check that timed out (Redis paused) runs once Redis resumes: it takes a slot in
/// A's entry that nobody holds. A's next renewal writes the count A really holds: 0
/// for "n" (the entry goes), 1 for "h", where A holds one by a decided check. The
/// fake clock never moves, so nothing frees itself: only the renewal can.
#[tokio::test]
async fn a_check_that_timed_out_but_ran_late_is_undone_by_the_next_renewal() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let a = Arc::new(Limiter::new(quick_store(&server, &clock), in_flight(2)));
    let b = Arc::new(Limiter::new(redis_store(&server, &clock), in_flight(2)));
    b.peek("n", 1).await.unwrap();
    let d = a.check("h", 1).await.unwrap();
    let _held = a.hold("h", &d).unwrap();
    let paused = server.pause();
    let (n, h) = tokio::join!(a.check("n", 1), a.check("h", 1));
    for late in [n, h] {
        match late {
            Err(redlimit::Error::Store(e)) => assert_eq!(e.kind(), StoreErrorKind::Timeout),
            other => panic!("a paused Redis decided: {other:?}"),
        }
    }
    paused.resume();
    let why = "the checks that timed out never ran";
    seen_within(&b, "n", 2, 1, Duration::from_secs(10), why).await;
    seen_within(&b, "h", 2, 2, Duration::from_secs(10), why).await;
    a.renew_slots().await;
    assert_eq!(
        in_flight_now(&b, "n", 2).await,
        0,
        "n: the slot nobody holds"
    );
    assert_eq!(in_flight_now(&b, "h", 2).await, 1, "h: the slot A holds");
    assert!(!server.keys().await.is_empty());
    server.assert_every_key_expires().await;
}

/// The same through the layer, failing open: a request let through unchecked while
/// Redis is paused leaves a late slot, and the renewal task (no slot held: started for
/// the check of unknown outcome) takes it away within a renewal period (4 s here) of
/// real time, where it would otherwise count for its slot lifetime (12 s: Redis
/// expires the key on its own clock).
#[tokio::test]
async fn a_request_that_failed_open_leaves_no_slot_past_the_next_renewal() {
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    let policy = Policy::in_flight("running", 1, Duration::from_secs(12)).unwrap();
    let a = Arc::new(Limiter::new(quick_store(&server, &clock), policy.clone()));
    let b = Arc::new(Limiter::new(redis_store(&server, &clock), policy));
    b.peek("p", 1).await.unwrap();
    a.peek("p", 1).await.unwrap();
    let service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::from_shared(Arc::clone(&a), UserHeader)
                .failure_mode(redlimit::layer::FailureMode::Open),
        )
        .service_fn(crate::support::layer::hello);
    let paused = server.pause();
    let response = service.oneshot(request("p")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "failed open");
    drop(response);
    paused.resume();
    seen_within(
        &b,
        "p",
        1,
        1,
        Duration::from_secs(10),
        "the late check never ran",
    )
    .await;
    let since = tokio::time::Instant::now();
    // A renewal period is 4 s; the bound leaves 6 s for a loaded machine and stays
    // short of the 12 s after which Redis drops the key by itself.
    seen_within(
        &b,
        "p",
        1,
        0,
        Duration::from_secs(10),
        "the renewal never undid the slot nobody holds",
    )
    .await;
    eprintln!("the late slot went after {:?}", since.elapsed());
    assert_eq!(a.held_slots(&Subject::new("p")), 0);
}

/// The number of `user`'s requests in flight as the in-flight policy of `limiter`
/// counts them, shadow or not: its own outcome in a peek.
async fn slots_counted<S: redlimit::store::Store>(limiter: &Limiter<S>, user: &str) -> u64 {
    let peek = limiter.peek(user, 1).await.unwrap();
    let at = limiter
        .policies()
        .iter()
        .position(Policy::is_in_flight)
        .unwrap();
    let outcome = peek.each_policy().unwrap()[at];
    if outcome.allowed {
        outcome.limit - 1 - outcome.remaining
    } else {
        outcome.limit
    }
}

/// A shadow in-flight policy beside the same policy enforced, on the same traffic: the
/// shadow's "would deny" answers are the enforced one's denials, and it counts what the
/// enforced one keeps, through renewals and releases. A request the shadow would deny
/// runs (shadow mode lets it through) without a slot: enforcing would have refused it.
async fn a_shadow_counts_what_enforcing_keeps<S: redlimit::store::Store + Sync>(
    shadow: Arc<Limiter<S>>,
    enforced: Arc<Limiter<S>>,
) {
    // A running request of each: its slot, if it holds one.
    let mut running: Vec<(Option<Permit>, Option<Permit>)> = Vec::new();
    let start = |running: &mut Vec<(Option<Permit>, Option<Permit>)>| {
        let (shadow, enforced) = (Arc::clone(&shadow), Arc::clone(&enforced));
        let mut running = std::mem::take(running);
        async move {
            let s = shadow.check("o", 1).await.unwrap();
            let e = enforced.check("o", 1).await.unwrap();
            assert!(s.is_allowed(), "{s:?}");
            assert_eq!(
                s.would_deny(),
                !e.is_allowed(),
                "request {}: {s:?} / {e:?}",
                running.len()
            );
            running.push((shadow.hold("o", &s), enforced.hold("o", &e)));
            running
        }
    };
    let agree = |what: &'static str| {
        let (shadow, enforced) = (Arc::clone(&shadow), Arc::clone(&enforced));
        async move {
            // Releases to Redis run as tasks of their own: a bounded number of turns.
            for _ in 0..100 {
                if slots_counted(&shadow, "o").await == slots_counted(&enforced, "o").await {
                    return;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(
                slots_counted(&shadow, "o").await,
                slots_counted(&enforced, "o").await,
                "{what}"
            );
        }
    };
    for _ in 0..6 {
        running = start(&mut running).await;
    }
    agree("six started").await;
    // One the enforced policy refused ends (it ran without a slot), then the renewals.
    running.remove(5);
    agree("a refused one ended").await;
    shadow.renew_slots().await;
    enforced.renew_slots().await;
    agree("renewed").await;
    // One it admitted ends: a slot frees, and a new request is admitted by both.
    running.remove(0);
    agree("an admitted one ended").await;
    running = start(&mut running).await;
    // The two other refused ones end (positions 2 and 3 now).
    running.remove(3);
    running.remove(2);
    agree("the refused ones ended").await;
    shadow.renew_slots().await;
    enforced.renew_slots().await;
    agree("renewed again").await;
    for _ in 0..2 {
        running = start(&mut running).await;
    }
    agree("two more").await;
    drop(running);
    agree("all ended").await;
}

#[tokio::test]
async fn a_shadow_in_flight_policy_counts_what_enforcing_keeps() {
    let shadow = Arc::new(Limiter::new(MemoryStore::new(), in_flight(3).shadow()));
    let enforced = Arc::new(Limiter::new(MemoryStore::new(), in_flight(3)));
    a_shadow_counts_what_enforcing_keeps(shadow, enforced).await;
    let server = RedisServer::start();
    let clock = FakeClock::new(1_700_000_000_000);
    // Apart in Redis: a shadow policy has the key it has when enforced.
    let with_rate = |p: Policy, prefix: &str| {
        Limiter::builder(redis_store(&server, &clock).prefix(prefix).unwrap())
            .policy(Policy::fixed_window("rate", 100, Duration::from_secs(60)).unwrap())
            .policy(p)
            .build()
            .unwrap()
    };
    let shadow = Arc::new(with_rate(in_flight(3).shadow(), "shadow"));
    let enforced = Arc::new(with_rate(in_flight(3), "enforced"));
    a_shadow_counts_what_enforcing_keeps(shadow, enforced).await;
}

/// A shadow in-flight policy beside another in-flight policy cannot count what
/// enforcing it would keep (a request's slot is one for both): refused, with the reason.
/// Beside rate policies, or alone, it is built.
#[test]
fn a_shadow_in_flight_policy_beside_another_is_refused_with_its_reason() {
    let tight = Policy::in_flight("tight", 2, SLOT_TTL).unwrap();
    for shadowed in [
        vec![in_flight(5), tight.clone().shadow()],
        vec![in_flight(5).shadow(), tight.clone()],
    ] {
        let name = shadowed
            .iter()
            .find(|p| p.is_shadow())
            .unwrap()
            .name()
            .to_owned();
        let error = shadowed
            .into_iter()
            .fold(Limiter::builder(MemoryStore::new()), |b, p| b.policy(p))
            .build()
            .unwrap_err();
        assert!(
            matches!(&error, redlimit::BuildError::ShadowInFlight(n) if *n == name),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(&format!("{name:?}")) && text.contains("limiter of its own"),
            "{text}"
        );
    }
    // Two enforced ones, or a shadow one beside rates, are built.
    for fine in [
        vec![in_flight(5), tight.clone()],
        vec![
            Policy::fixed_window("rate", 9, SLOT_TTL).unwrap().shadow(),
            tight.shadow(),
        ],
    ] {
        fine.into_iter()
            .fold(Limiter::builder(MemoryStore::new()), |b, p| b.policy(p))
            .build()
            .unwrap();
    }
}

/// Leases never apply to a set with an in-flight policy, shadow or not, beside rates
/// or alone: a slot belongs to the request that holds it.
#[test]
fn leases_refuse_a_set_with_an_in_flight_policy() {
    let rate = Policy::fixed_window("rate", 100, SLOT_TTL).unwrap();
    for policies in [
        vec![in_flight(3)],
        vec![rate.clone(), in_flight(3)],
        vec![rate.clone(), in_flight(3).shadow()],
    ] {
        let error = policies
            .into_iter()
            .fold(Limiter::builder(MemoryStore::new()), |b, p| b.policy(p))
            .leases(redlimit::lease::Leases::new())
            .build()
            .unwrap_err();
        assert!(
            matches!(
                &error,
                redlimit::BuildError::LeaseInFlight(n) if n == "running"
            ),
            "{error:?}"
        );
    }
    // Control: the same rate alone leases.
    Limiter::builder(MemoryStore::new())
        .policy(rate)
        .leases(redlimit::lease::Leases::new())
        .build()
        .unwrap();
}

/// A refused request's headers are the ones docs/in_flight.md shows (its `text` block):
/// `RateLimit`'s `t` is the retry hint, the same as `Retry-After`. An admitted one's
/// `t`, and `X-RateLimit-Reset` on both, is the slot lifetime (how long the slots
/// counted now count if nobody renews them), as the page says.
#[tokio::test]
async fn an_in_flight_refusal_s_headers_are_the_ones_the_docs_show() {
    let page = include_str!("../../docs/in_flight.md");
    let section = page
        .split("## What a refused request is told")
        .nth(1)
        .expect("the page's section on refusals");
    let shown = section
        .split("```text\n")
        .nth(1)
        .and_then(|block| block.split("```").next())
        .expect("the headers the page shows");
    let limiter = Arc::new(Limiter::new(
        MemoryStore::new(),
        Policy::in_flight("running", 20, SLOT_TTL).unwrap(),
    ));
    let bodies = Bodies::default();
    let service = ServiceBuilder::new()
        .layer(
            RateLimitLayer::from_shared(limiter, UserHeader)
                .header_style(redlimit::layer::HeaderStyle::Both),
        )
        .service_fn(move |req| bodies.clone().handler(req));
    let mut running = Vec::new();
    for _ in 0..20 {
        let admitted = service.clone().oneshot(request("q")).await.unwrap();
        assert_eq!(admitted.status(), StatusCode::OK);
        assert_eq!(header(admitted.headers(), "x-ratelimit-reset"), Some("30"));
        running.push(admitted);
    }
    assert_eq!(
        header(running[0].headers(), "ratelimit"),
        Some(r#""running";r=19;t=30"#)
    );
    let refused = service.clone().oneshot(request("q")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    for line in shown.lines() {
        let (name, value) = line.split_once(": ").expect("a header line");
        assert_eq!(
            header(refused.headers(), name),
            Some(value),
            "docs/in_flight.md shows {line}"
        );
    }
    assert_eq!(header(refused.headers(), "x-ratelimit-reset"), Some("30"));
    drop(running.pop());
    let again = service.oneshot(request("q")).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
}

/// What [`Flaky`] does with a call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Up,
    /// Fails without running, as a Redis out of reach.
    Down,
    /// Runs, then fails: a call that timed out and ran late.
    RanLate,
}

/// A memory store whose calls fail at will, to follow a subject through many rounds.
#[derive(Clone)]
struct Flaky {
    store: MemoryStore,
    mode: Arc<Mutex<Mode>>,
}

impl Flaky {
    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn answer(
        &self,
        decided: impl FnOnce() -> Result<Decision, redlimit::store::StoreError>,
    ) -> std::future::Ready<Result<Decision, redlimit::store::StoreError>> {
        let mode = *self.mode.lock().unwrap();
        let failed = redlimit::store::StoreError::timeout();
        std::future::ready(match mode {
            Mode::Up => decided(),
            Mode::Down => Err(failed),
            Mode::RanLate => decided().and(Err(failed)),
        })
    }
}

impl Backend for Flaky {
    type Future = std::future::Ready<Result<Decision, redlimit::store::StoreError>>;

    fn check(&self, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.answer(|| self.store.check(subject, set, cost).into_inner())
    }
}

impl AdminStore for Flaky {
    fn run(&self, op: Operation, subject: Subject, set: &PolicySet, cost: u64) -> Self::Future {
        self.answer(|| self.store.run(op, subject, set, cost).into_inner())
    }
}

/// A check that ran but failed takes a slot nobody holds: the next round the store
/// answers renews its subject with 0, and the one after once more (a connection the
/// store replaced may still have held it), then it is settled. While the store fails,
/// such subjects are kept for the next round, at most 4,096 of them.
#[tokio::test]
async fn checks_of_unknown_outcome_are_renewed_until_settled_and_at_most_4096_are_kept() {
    let memory = MemoryStore::new();
    let flaky = Flaky {
        store: memory.clone(),
        mode: Arc::new(Mutex::new(Mode::RanLate)),
    };
    let a = Arc::new(Limiter::new(flaky.clone(), in_flight(2)));
    let b = Limiter::new(memory, in_flight(2));
    assert!(a.check("x", 1).await.is_err());
    assert_eq!(in_flight_now(&b, "x", 2).await, 1, "the check ran");
    flaky.set(Mode::Down);
    assert_eq!(a.renew_slots().await, 1);
    assert_eq!(in_flight_now(&b, "x", 2).await, 1, "not renewed: kept");
    flaky.set(Mode::Up);
    assert_eq!(a.renew_slots().await, 1);
    assert_eq!(in_flight_now(&b, "x", 2).await, 0, "renewed with 0");
    assert_eq!(a.renew_slots().await, 1, "the second renewal");
    assert_eq!(a.renew_slots().await, 0, "settled");

    flaky.set(Mode::Down);
    for i in 0..5_000 {
        assert!(a.check(format!("u{i}"), 1).await.is_err());
    }
    assert_eq!(a.renew_slots().await, 4_096);
    assert_eq!(a.renew_slots().await, 4_096, "kept while the store fails");
    flaky.set(Mode::Up);
    assert_eq!(a.renew_slots().await, 4_096);
    assert_eq!(a.renew_slots().await, 4_096);
    assert_eq!(a.renew_slots().await, 0);
}
