//! Calendar quota: a count per calendar period (a day, a week or a month in a time
//! zone), reset at the period's start. The Rust twin of `lua/calendar.lua`; the state is
//! `(period end in ms, count)`, which the script keeps packed in 12 bytes (`>I6I6`; 7
//! bytes each past 2^48).
//!
//! The Lua has no time zone database: the store computes the end of the period its
//! view of now is in ([`period_at`]) and hands it to the script in the policy's
//! arguments, and the script decides with its own now. Both sides decide by
//! [`decide_in`]'s rule, given that end:
//!
//! - a stored end equal to it is the period's count; a stored end ahead of it (by at
//!   most [`MAX_AHEAD_MS`]) is a clock that went back, or a store whose clock is behind
//!   the one that wrote it: the decision stays in the stored period, as a fixed window
//!   stays in its stored window; further ahead, or behind, it is read as fresh;
//! - a now at or past the given end (the script's clock ahead of the one that computed
//!   it, at a boundary) decides in the given period as at its last millisecond: the
//!   reset is 1 ms, and the next call, computed on the far side, counts afresh.

use super::state::{Commit, State, Step, MAX_CLOCK_BACK, MAX_DEBT};
use crate::decision::PolicyOutcome;
use crate::policy::Policy;

/// How far a stored period's end may be ahead of the current one and still be
/// decided on: [`MAX_CLOCK_BACK`] days, whatever the period (the Lua reads one
/// number, not the period's kind). A clock that goes back further reads the stored
/// period as foreign and counts afresh, so no subject waits more than this past its
/// own period's end.
pub(crate) const MAX_AHEAD_MS: u64 = MAX_CLOCK_BACK * 86_400_000;

/// The calendar period `now_ms` is in, `(start, end)` in ms since the epoch, `start <=
/// now_ms < end` (for any now before `u64::MAX`).
///
/// Outside the range the zone database covers (before 1970, after the year 9999) or
/// for a policy that is no calendar quota, the period is the policy's window aligned to
/// the epoch: defined, never reached by a real clock.
pub(crate) fn period_at(policy: &Policy, now_ms: u64) -> (u64, u64) {
    #[cfg(feature = "calendar")]
    if let Some(found) = policy
        .calendar_spec()
        .and_then(|calendar| zoned::boundaries(calendar, now_ms))
    {
        return found;
    }
    let w = policy.window_ms().max(1);
    let start = now_ms - now_ms % w;
    (start, start.saturating_add(w))
}

#[cfg(feature = "calendar")]
mod zoned {
    use jiff::civil::{Date, Time, Weekday};
    use jiff::Timestamp;

    use crate::policy::{Calendar, Period};

    /// The period around `now_ms`, or `None` where the database cannot say.
    pub(super) fn boundaries(calendar: &Calendar, now_ms: u64) -> Option<(u64, u64)> {
        let now = Timestamp::from_millisecond(i64::try_from(now_ms).ok()?).ok()?;
        let today = calendar.zone.to_datetime(now).date();
        let anchor = i8::try_from(calendar.anchor).ok()?;
        let (first, next) = match calendar.period {
            Period::Day => (today, today.tomorrow().ok()?),
            Period::Week => {
                let weekday = Weekday::from_monday_one_offset(anchor).ok()?;
                let first = if today.weekday() == weekday {
                    today
                } else {
                    today.nth_weekday(-1, weekday).ok()?
                };
                (first, first.nth_weekday(1, weekday).ok()?)
            }
            Period::Month => {
                let (year, month) = (today.year(), today.month());
                let (year, month) = if today.day() >= anchor {
                    (year, month)
                } else if month == 1 {
                    (year.checked_sub(1)?, 12)
                } else {
                    (year, month - 1)
                };
                let (next_year, next_month) = if month == 12 {
                    (year.checked_add(1)?, 1)
                } else {
                    (year, month + 1)
                };
                (
                    Date::new(year, month, anchor).ok()?,
                    Date::new(next_year, next_month, anchor).ok()?,
                )
            }
        };
        let (start, end) = (midnight(calendar, first)?, midnight(calendar, next)?);
        (start <= now_ms && now_ms < end).then_some((start, end))
    }

    /// 00:00 of `date` in the zone, in ms; where a clock change skips midnight, the
    /// first instant after the gap (a repeated midnight: the first).
    fn midnight(calendar: &Calendar, date: Date) -> Option<u64> {
        let at = calendar
            .zone
            .to_ambiguous_timestamp(date.to_datetime(Time::midnight()))
            .compatible()
            .ok()?;
        u64::try_from(at.as_millisecond()).ok()
    }
}

/// The end of the period `now` counts in, given the current period's `end`, and its
/// count so far: the stored period when its end is `end` or ahead of it by at most
/// [`MAX_AHEAD_MS`]; else a fresh one.
#[inline(always)]
fn current(state: Option<&State>, end: u64) -> (u64, u64) {
    match state {
        Some(State::Calendar { end: stored, count })
            if *stored >= end && *stored - end <= MAX_AHEAD_MS =>
        {
            (*stored, *count)
        }
        _ => (end, 0),
    }
}

/// `now` as the decision reads it: before `end` (a clock past the end it was given
/// decides at the period's last millisecond).
#[inline(always)]
fn clamped(now: u64, end: u64) -> u64 {
    now.min(end.saturating_sub(1))
}

#[inline(always)]
pub(super) fn decide(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Step {
    decide_in(policy, state, now, period_at(policy, now).1, cost)
}

/// The decision of `cost` at `now` in the period that ends at `end` (as the store
/// computed it): what the Lua decides, given `end`.
pub(crate) fn decide_in(
    policy: &Policy,
    state: Option<&State>,
    now: u64,
    end: u64,
    cost: u64,
) -> Step {
    let limit = policy.limit();
    let (end, mut count) = current(state, end);
    let reset = end - clamped(now, end);
    let allowed = count + cost <= limit;
    if allowed {
        count += cost;
    }
    Step {
        outcome: PolicyOutcome {
            allowed,
            limit,
            remaining: limit.saturating_sub(count),
            reset_after_ms: reset,
            retry_after_ms: if allowed { 0 } else { reset },
        },
        commit: allowed.then_some(Commit::Set(State::Calendar { end, count })),
        ttl_ms: reset,
    }
}

/// The current period's count goes down by `cost`, not below 0; a period that has
/// ended since keeps nothing to refund.
pub(super) fn refund(
    policy: &Policy,
    stored_end: u64,
    count: u64,
    now: u64,
    cost: u64,
) -> Option<State> {
    let end = period_at(policy, now).1;
    (stored_end >= end && stored_end - end <= MAX_AHEAD_MS && count > 0).then(|| State::Calendar {
        end: stored_end,
        count: count.saturating_sub(cost),
    })
}

/// The current period's count goes up by `cost` (a new period starts at `cost`), to at
/// most [`MAX_DEBT`] limits; kept to the period's end.
pub(super) fn charge(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> (State, u64) {
    let (end, count) = current(state, period_at(policy, now).1);
    let most = MAX_DEBT * policy.limit();
    let count = count.max(most.min(count.saturating_add(cost)));
    (State::Calendar { end, count }, end - clamped(now, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Period;
    use jiff::civil::date;
    use jiff::tz::TimeZone;

    /// `y-m-d h:00` in `zone`, in ms.
    fn at(zone: &str, y: i16, m: i8, d: i8, h: i8) -> u64 {
        let tz = TimeZone::get(zone).unwrap();
        let ts = date(y, m, d).at(h, 0, 0, 0).to_zoned_datetime(tz).unwrap();
        u64::try_from(ts.timestamp().as_millisecond()).unwrap()
    }

    const HOUR: u64 = 3_600_000;

    #[test]
    fn a_month_from_the_15th_in_new_york_spans_the_end_of_daylight_time() {
        let p = Policy::calendar("m", 100, Period::Month, "America/New_York", 15).unwrap();
        let (start, end) = period_at(&p, at("America/New_York", 2026, 10, 20, 12));
        // 2026-10-15T00:00-04:00 and 2026-11-15T00:00-05:00.
        assert_eq!(start, 1_792_036_800_000);
        assert_eq!(end, 1_794_718_800_000);
        assert_eq!(start, at("UTC", 2026, 10, 15, 4));
        assert_eq!(end, at("UTC", 2026, 11, 15, 5));
        // 31 days and the hour clocks go back on 1 November.
        assert_eq!(end - start, 31 * 24 * HOUR + HOUR);
        // Before the anchor day: the period that started the month before.
        let (start, end) = period_at(&p, at("America/New_York", 2027, 1, 3, 0));
        assert_eq!(start, at("America/New_York", 2026, 12, 15, 0));
        assert_eq!(end, at("America/New_York", 2027, 1, 15, 0));
        // Its first millisecond is in it, the last one before the next is too.
        assert_eq!(period_at(&p, start).0, start);
        assert_eq!(period_at(&p, end - 1), (start, end));
        assert_eq!(period_at(&p, end).0, end);
    }

    #[test]
    fn days_that_change_clocks_last_23_and_25_hours() {
        let p = Policy::calendar("d", 10, Period::Day, "America/New_York", 1).unwrap();
        let len = |y, m, d| {
            let (start, end) = period_at(&p, at("America/New_York", y, m, d, 12));
            assert_eq!(start, at("America/New_York", y, m, d, 0));
            end - start
        };
        assert_eq!(len(2026, 3, 8), 23 * HOUR);
        assert_eq!(len(2026, 11, 1), 25 * HOUR);
        assert_eq!(len(2026, 11, 2), 24 * HOUR);
        // Where daylight time starts at midnight (Santiago, 2026-09-06), the day starts
        // at the first instant after the gap, 01:00 local.
        let santiago = Policy::calendar("d", 10, Period::Day, "America/Santiago", 1).unwrap();
        let (start, end) = period_at(&santiago, at("America/Santiago", 2026, 9, 6, 12));
        assert_eq!(start, at("America/Santiago", 2026, 9, 6, 1));
        assert_eq!(end - start, 23 * HOUR);
    }

    #[test]
    fn a_week_starts_on_its_anchor_weekday() {
        // Anchor 3: Wednesday. 2026-12-02 is a Wednesday.
        let p = Policy::calendar("w", 10, Period::Week, "Europe/Paris", 3).unwrap();
        for (d, h) in [(2, 0), (2, 23), (5, 12), (8, 23)] {
            assert_eq!(
                period_at(&p, at("Europe/Paris", 2026, 12, d, h)),
                (
                    at("Europe/Paris", 2026, 12, 2, 0),
                    at("Europe/Paris", 2026, 12, 9, 0)
                ),
                "12-{d} {h}:00"
            );
        }
        assert_eq!(
            period_at(&p, at("Europe/Paris", 2026, 12, 1, 23)).0,
            at("Europe/Paris", 2026, 11, 25, 0)
        );
        // Sunday (7), across the change to summer time on 2027-03-28 at 02:00: 167 hours.
        let sunday = Policy::calendar("w", 10, Period::Week, "Europe/Paris", 7).unwrap();
        let (start, end) = period_at(&sunday, at("Europe/Paris", 2027, 3, 30, 12));
        assert_eq!(start, at("Europe/Paris", 2027, 3, 28, 0));
        assert_eq!(end - start, 7 * 24 * HOUR - HOUR);
    }

    #[test]
    fn utc_days_are_aligned_to_the_epoch() {
        let p = Policy::calendar("d", 10, Period::Day, "UTC", 1).unwrap();
        for now in [0, 1, 86_399_999, 86_400_000, 1_764_633_600_123] {
            let start = now - now % 86_400_000;
            assert_eq!(period_at(&p, now), (start, start + 86_400_000), "{now}");
        }
        let m = Policy::calendar("m", 10, Period::Month, "UTC", 1).unwrap();
        assert_eq!(
            period_at(&m, at("UTC", 2028, 2, 29, 23)),
            (at("UTC", 2028, 2, 1, 0), at("UTC", 2028, 3, 1, 0))
        );
    }

    #[test]
    fn a_time_past_the_database_is_a_defined_period() {
        let p = Policy::calendar("d", 10, Period::Month, "Asia/Tokyo", 28).unwrap();
        for now in [u64::MAX - 1, 1 << 62, 300_000_000_000_000] {
            let (start, end) = period_at(&p, now);
            assert!(start <= now && now < end, "{now}");
        }
        let step = decide(&p, None, u64::MAX, 1);
        assert!(step.outcome.allowed);
    }

    #[test]
    fn bad_zones_and_anchors_are_refused() {
        use crate::policy::PolicyError;
        assert!(matches!(
            Policy::calendar("q", 1, Period::Day, "Mars/Olympus_Mons", 1),
            Err(PolicyError::UnknownTimeZone(..))
        ));
        assert!(matches!(
            Policy::calendar("q", 1, Period::Day, "", 1),
            Err(PolicyError::UnknownTimeZone(..))
        ));
        for (period, bad) in [
            (Period::Day, 2),
            (Period::Day, 0),
            (Period::Week, 8),
            (Period::Month, 29),
            (Period::Month, 0),
        ] {
            assert!(
                matches!(
                    Policy::calendar("q", 1, period, "UTC", bad),
                    Err(PolicyError::BadAnchor(..))
                ),
                "{period:?} {bad}"
            );
        }
        assert!(matches!(
            Policy::calendar("q", 0, Period::Day, "UTC", 1),
            Err(PolicyError::ZeroLimit(_))
        ));
        // The zone as the database spells it: one identity however it was typed.
        let a = Policy::calendar("q", 1, Period::Day, "europe/paris", 1).unwrap();
        let b = Policy::calendar("q", 1, Period::Day, "Europe/Paris", 1).unwrap();
        assert_eq!(a.time_zone(), Some("Europe/Paris"));
        assert_eq!(a, b);
        assert_ne!(
            a,
            Policy::calendar("q", 1, Period::Day, "Europe/Berlin", 1).unwrap()
        );
    }

    #[test]
    fn the_count_lasts_the_period_and_a_clock_back_stays_in_it() {
        let p = Policy::calendar("m", 3, Period::Day, "UTC", 1).unwrap();
        let day = 86_400_000;
        let t = 10 * day + 5;
        let out = crate::algorithm::tests::run(&p, &[(t, 2), (t + 1, 1), (t + 2, 1)]);
        assert_eq!(
            out.iter()
                .map(|o| (o.allowed, o.remaining))
                .collect::<Vec<_>>(),
            [(true, 1), (true, 0), (false, 0)]
        );
        assert_eq!(out[2].retry_after_ms, 11 * day - t - 2);
        assert_eq!(out[0].reset_after_ms, 11 * day - t);
        let full = State::Calendar {
            end: 11 * day,
            count: 3,
        };
        // The next day is fresh.
        assert!(decide(&p, Some(&full), 11 * day, 3).outcome.allowed);
        // A clock a day behind stays in the stored period, waiting for its end...
        let back = decide(&p, Some(&full), 9 * day + 7, 1).outcome;
        assert!(!back.allowed);
        assert_eq!(back.retry_after_ms, 2 * day - 7);
        // ...up to MAX_CLOCK_BACK days; further, the stored period is foreign.
        let bound = 11 * day - MAX_AHEAD_MS - day;
        assert!(!decide(&p, Some(&full), bound, 1).outcome.allowed);
        assert!(decide(&p, Some(&full), bound - 1, 1).outcome.allowed);
    }

    #[test]
    fn a_clock_past_the_end_it_was_given_decides_at_the_periods_last_ms() {
        let p = Policy::calendar("m", 3, Period::Day, "UTC", 1).unwrap();
        let end = 86_400_000;
        let full = State::Calendar { end, count: 3 };
        for now in [end, end + 5, u64::MAX] {
            let denied = decide_in(&p, Some(&full), now, end, 1);
            assert!(!denied.outcome.allowed);
            assert_eq!(denied.outcome.retry_after_ms, 1);
            let fresh = decide_in(&p, None, now, end, 1);
            assert!(fresh.outcome.allowed);
            assert_eq!((fresh.outcome.reset_after_ms, fresh.ttl_ms), (1, 1));
        }
    }

    #[test]
    fn refunds_and_charges_count_in_the_current_period() {
        use crate::algorithm::tests::{charged_after, refunded_after};
        let p = Policy::calendar("m", 5, Period::Day, "UTC", 1).unwrap();
        let day = 86_400_000;
        assert_eq!(
            refunded_after(&p, &[(100, 3)], 200, 9),
            Some(State::Calendar { end: day, count: 0 })
        );
        assert_eq!(refunded_after(&p, &[(100, 3)], day, 1), None);
        let (charged, ttl) = charged_after(&p, &[(100, 3)], 200, 4);
        assert_eq!(charged, State::Calendar { end: day, count: 7 });
        assert_eq!(ttl, day - 200);
        // Owed until the day ends (checked at its ends: a day of milliseconds is long).
        let denied = decide(&p, Some(&charged), 300, 1).outcome;
        assert!(!denied.allowed);
        assert_eq!(300 + denied.retry_after_ms, day);
        assert!(!decide(&p, Some(&charged), day - 1, 1).outcome.allowed);
        assert!(decide(&p, Some(&charged), day, 1).outcome.allowed);
        assert_eq!(
            charged_after(&p, &[], 1_500, u64::MAX).0,
            State::Calendar {
                end: day,
                count: MAX_DEBT * 5
            }
        );
    }

    #[test]
    fn midnight_of_a_date_is_its_first_instant() {
        let tz = TimeZone::get("America/New_York").unwrap();
        let cal =
            crate::policy::Policy::calendar("d", 1, Period::Day, "America/New_York", 1).unwrap();
        let spec = cal.calendar_spec().unwrap();
        let ms = zoned::boundaries(spec, at("America/New_York", 2026, 6, 1, 3))
            .unwrap()
            .0;
        let local = tz.to_datetime(jiff::Timestamp::from_millisecond(ms as i64).unwrap());
        assert_eq!(local, date(2026, 6, 1).at(0, 0, 0, 0));
    }
}
