//! Calendar quotas on both stores, on a fake clock: a month of New York time from the
//! 15th, counted across the end of daylight time and fresh at the next 15th; the
//! periods on Redis's own clock; a denial through the layer with its quota status;
//! a changed anchor or zone counting apart.

use crate::support;

use std::time::Duration;

use http::StatusCode;
use redlimit::clock::{Clock, FakeClock, SystemClock};
use redlimit::layer::BodyStyle;
use redlimit::{Decision, Limiter, MemoryStore, Period, Policy, RateLimitLayer, RedisStore};
use support::layer::{body_text, header, hello, request, UserHeader, RATELIMIT_POLICY};
use support::RedisServer;
use tower::{ServiceBuilder, ServiceExt};

/// 2026-10-20T12:00 in New York (16:00Z), a Tuesday in daylight time.
const OCT_20_NOON_NY: u64 = 1_792_512_000_000;
/// 2026-11-15T00:00-05:00: the end of the period October 20 is in (daylight time ends
/// on 1 November between).
const NOV_15_NY: u64 = 1_794_718_800_000;
/// 2026-12-15T00:00-05:00.
const DEC_15_NY: u64 = 1_797_310_800_000;

fn monthly() -> Policy {
    Policy::calendar("monthly", 100_000, Period::Month, "America/New_York", 15).unwrap()
}

/// The scenario of a monthly quota, on `limiter` whose clock is `clock`.
async fn a_month_from_the_15th<S: redlimit::store::Store>(limiter: &Limiter<S>, clock: &FakeClock)
where
    S::Future: Send,
{
    clock.set_ms(OCT_20_NOON_NY);
    let d: Decision = limiter.check("acme", 100).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 99_900);
    assert_eq!(
        d.reset_after(),
        Duration::from_millis(NOV_15_NY - OCT_20_NOON_NY)
    );
    // Through 1 November (clocks go back an hour) to the last millisecond before the
    // 15th: still the same period.
    clock.set_ms(NOV_15_NY - 1);
    let d = limiter.check("acme", 1).await.unwrap();
    assert_eq!(d.remaining(), 99_899);
    assert_eq!(d.reset_after(), Duration::from_millis(1));
    // Midnight of the 15th, New York time: fresh, until 15 December.
    clock.set_ms(NOV_15_NY);
    let d = limiter.check("acme", 1).await.unwrap();
    assert_eq!(d.remaining(), 99_999);
    assert_eq!(
        d.reset_after(),
        Duration::from_millis(DEC_15_NY - NOV_15_NY)
    );
    // The whole quota: denied until the period's end.
    let d = limiter.check("acme", 99_999).await.unwrap();
    assert!(d.is_allowed());
    clock.advance(Duration::from_secs(3_600));
    let d = limiter.check("acme", 1).await.unwrap();
    assert!(!d.is_allowed());
    assert!(d.policy().is_quota());
    assert_eq!(
        d.retry_after(),
        Some(Duration::from_millis(DEC_15_NY - NOV_15_NY - 3_600_000))
    );
}

#[tokio::test]
async fn a_monthly_quota_in_new_york_resets_at_the_15th_on_the_memory_store() {
    let clock = FakeClock::new(0);
    let limiter = Limiter::new(MemoryStore::with_clock(clock.clone()), monthly());
    a_month_from_the_15th(&limiter, &clock).await;
}

#[tokio::test]
async fn a_monthly_quota_in_new_york_resets_at_the_15th_on_redis() {
    let server = RedisServer::start();
    let clock = FakeClock::new(0);
    let store = server
        .store()
        .client_clock(clock.clone())
        .timeout(Duration::from_secs(5));
    let limiter = Limiter::new(store, monthly());
    a_month_from_the_15th(&limiter, &clock).await;
    server.assert_every_key_expires().await;
}

/// Without a client clock the store computes the period on the system clock and the
/// Lua decides on Redis `TIME` (the same machine's clock here): the reset is the
/// period's end as the system clock sees it.
#[tokio::test]
async fn on_redis_time_the_period_is_the_system_clock_s() {
    let server = RedisServer::start();
    let store: RedisStore = server.store().timeout(Duration::from_secs(5));
    let daily = Policy::calendar("daily", 10, Period::Day, "UTC", 1).unwrap();
    let limiter = Limiter::new(store, daily);
    let before = SystemClock.now_ms();
    let d = limiter.check("acme", 3).await.unwrap();
    let after = SystemClock.now_ms();
    assert_eq!(d.remaining(), 7);
    let end = (after / 86_400_000 + 1) * 86_400_000;
    let reset = u64::try_from(d.reset_after().as_millis()).unwrap();
    // Unless the day ended during the call (then the reset names 1 ms, or the next).
    if before / 86_400_000 == after / 86_400_000 {
        assert!(
            (end - after..=end - before).contains(&reset),
            "reset {reset} ms, the day ends in {} ms",
            end - after
        );
    }
    server.assert_every_key_expires().await;
}

/// A denial by a calendar quota answers the layer's quota status (402 here), with
/// `Retry-After` the seconds to the period's end and a body naming the quota and its
/// reset; a rate policy's denial beside it stays a 429.
#[tokio::test]
async fn a_quota_denial_answers_the_quota_status() {
    // On the system's time, so the body's reset point (named on the system clock) is
    // the fake clock's too.
    let clock = FakeClock::new(SystemClock.now_ms());
    let daily = Policy::calendar("daily", 2, Period::Day, "UTC", 1).unwrap();
    let burst = Policy::fixed_window("burst", 5, Duration::from_secs(10)).unwrap();
    let limiter = Limiter::builder(MemoryStore::with_clock(clock.clone()))
        .policy(burst)
        .policy(daily)
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(limiter, UserHeader)
                .quota_status(StatusCode::PAYMENT_REQUIRED)
                .body_style(BodyStyle::PlainText),
        )
        .service_fn(hello);
    for _ in 0..2 {
        let ok = svc.clone().oneshot(request("alice")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        // The current day's length, in the period's `w`.
        let policy = header(ok.headers(), RATELIMIT_POLICY).unwrap();
        assert!(policy.contains(r#""daily";q=2;w=86400"#), "{policy}");
    }
    let now = clock.now_ms();
    let denied = svc.clone().oneshot(request("alice")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::PAYMENT_REQUIRED);
    let end = (now / 86_400_000 + 1) * 86_400_000;
    let retry: u64 = header(denied.headers(), "retry-after")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry, (end - now).div_ceil(1_000));
    let body = body_text(denied).await;
    assert!(
        body.starts_with("Payment Required: quota 'daily' of 2 used up; it resets at "),
        "{body}"
    );
    assert!(body.contains("T00:00:00+00:00[UTC]"), "{body}");
    assert!(body.ends_with(&format!("retry after {retry} s")), "{body}");

    // A rate denial is a 429 still: five in ten seconds for bob.
    let clock2 = FakeClock::new(SystemClock.now_ms());
    let limiter = Limiter::builder(MemoryStore::with_clock(clock2))
        .policy(Policy::fixed_window("burst", 1, Duration::from_secs(10)).unwrap())
        .policy(Policy::calendar("daily", 100, Period::Day, "UTC", 1).unwrap())
        .build()
        .unwrap();
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, UserHeader).quota_status(StatusCode::PAYMENT_REQUIRED))
        .service_fn(hello);
    assert_eq!(
        svc.clone().oneshot(request("bob")).await.unwrap().status(),
        StatusCode::OK
    );
    let denied = svc.clone().oneshot(request("bob")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A status that is no 4xx is refused: quota denials stay 429.
#[tokio::test]
async fn a_quota_status_outside_4xx_is_refused() {
    let clock = FakeClock::new(SystemClock.now_ms());
    let limiter = Limiter::new(
        MemoryStore::with_clock(clock),
        Policy::calendar("daily", 1, Period::Day, "UTC", 1).unwrap(),
    );
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, UserHeader).quota_status(StatusCode::OK))
        .service_fn(hello);
    assert_eq!(
        svc.clone().oneshot(request("a")).await.unwrap().status(),
        StatusCode::OK
    );
    let denied = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A quota whose anchor or zone changed under the same name counts afresh (its
/// fingerprint differs), as a changed window does, on both stores.
#[tokio::test]
async fn a_changed_anchor_or_zone_counts_apart() {
    let server = RedisServer::start();
    let clock = FakeClock::new(OCT_20_NOON_NY);
    let memory = MemoryStore::with_clock(clock.clone());
    let redis = server.store().client_clock(clock.clone());
    let quota =
        |zone: &str, anchor| Policy::calendar("monthly", 10, Period::Month, zone, anchor).unwrap();
    for (i, changed) in [quota("America/New_York", 16), quota("America/Chicago", 15)]
        .into_iter()
        .enumerate()
    {
        let subject = format!("acme-{i}");
        let on_memory = Limiter::new(memory.clone(), quota("America/New_York", 15));
        let on_redis = Limiter::new(redis.clone(), quota("America/New_York", 15));
        assert_eq!(
            on_memory
                .check(subject.clone(), 10)
                .await
                .unwrap()
                .remaining(),
            0
        );
        assert_eq!(
            on_redis
                .check(subject.clone(), 10)
                .await
                .unwrap()
                .remaining(),
            0
        );
        let on_memory = Limiter::new(memory.clone(), changed.clone());
        let on_redis = Limiter::new(redis.clone(), changed);
        assert!(on_memory
            .check(subject.clone(), 10)
            .await
            .unwrap()
            .is_allowed());
        assert!(on_redis.check(subject, 10).await.unwrap().is_allowed());
    }
}
