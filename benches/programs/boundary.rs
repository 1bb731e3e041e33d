//! the boundary test, in real time, for the four algorithms.
//!
//! ```text
//! cargo run --release -p redlimit-bench --example boundary                                    # memory store
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release -p redlimit-bench --example boundary  # Redis, TIME mode
//! cargo run --release -p redlimit-bench --example boundary -- --plot docs/img/boundary.svg    # and draw it
//! ```
//!
//! Limit 100 per second (the token bucket: capacity 100, refilled 100 per second).
//! 200 requests are sent evenly over the last 130 ms before a window boundary, then
//! 200 over the first 20 ms after it, each at its own instant: a request does not
//! wait for the previous answer. Each algorithm gets a fresh subject and its own
//! upcoming boundary; the whole run takes a few seconds. This is the scenario of the
//! unit test `boundary_scenario` in `src/algorithm/mod.rs` (same instants, on a fake
//! clock there): fixed window 100 + 100 = 200, sliding window 100 + 2 = 102, token
//! bucket 112 + 3 = 115, sliding log 100 + 0 = 100.
//!
//! A run in which some request left more than 1 ms after its instant (a busy machine
//! can deschedule the sender for milliseconds) is run again, up to 5 times; the table
//! shows the send delays and how many runs it took.
//!
//! Without `REDIS_URL` the memory store decides on the monotonic clock. With it, the
//! Redis store decides on Redis `TIME` (its default): the example first reads `TIME`
//! to map Redis time onto the local clock, then sends each request half a round trip
//! early, so the script reads the intended millisecond.
//!
//! Prints the published table and, for machines, one line per algorithm:
//! `boundary fixed_window end=100 start=100 total=200`. Exits with status 1 when a
//! total is off: the fixed window and the sliding log must be exact (200 and 100),
//! the sliding window and the token bucket within 2 of 102 and 115 (real timing
//! jitters by a fraction of a millisecond). With `--plot PATH` it also draws the
//! cumulative admitted requests around the boundary, one line per algorithm, as SVG.

use redlimit::internals::Store;
use std::error::Error;
use std::time::{Duration, Instant};

use redlimit::clock::{Clock, MonotonicClock};
use redlimit::deadpool_redis::{self, redis};
use redlimit::{Algorithm, Limiter, MemoryStore, Policy, RedisStore, Subject};
use tokio::runtime::Runtime;

/// Requests on each side of the boundary.
const PER_SIDE: u64 = 200;
/// The span before the boundary that the first 200 requests cover.
const END_SPAN_US: u64 = 130_000;
/// The span after it that the next 200 cover (the last one at 20.9 ms).
const START_SPAN_US: u64 = 21_000;
/// Time left before the first request, to set up the run.
const SETUP_US: u64 = 50_000;
/// A run where some request left later than this after its instant is run again (a
/// busy machine can deschedule the sender for milliseconds)...
const SLIP: Duration = Duration::from_millis(1);
/// ...up to this many times; then the run that slipped least is kept.
const ATTEMPTS: u32 = 5;

/// The published figures: (end of window, start of next, total). Only the totals are
/// compared: the published bucket split its 115 as 101 + 14, where these instants give
/// 112 + 3 (the bucket refills during the 130 ms, whichever side of the boundary).
fn expected(algorithm: Algorithm) -> (u64, u64, u64) {
    match algorithm {
        Algorithm::FixedWindow => (100, 100, 200),
        Algorithm::SlidingWindow => (100, 2, 102),
        Algorithm::TokenBucket => (101, 14, 115),
        _ => (100, 0, 100),
    }
}

/// How far a measured total may be from [`expected`]: the exact algorithms not at all.
fn tolerance(algorithm: Algorithm) -> u64 {
    match algorithm {
        Algorithm::SlidingWindow | Algorithm::TokenBucket => 2,
        _ => 0,
    }
}

fn policy(algorithm: Algorithm) -> Policy {
    let second = Duration::from_secs(1);
    match algorithm {
        Algorithm::FixedWindow => Policy::fixed_window("boundary", 100, second),
        Algorithm::SlidingWindow => Policy::sliding_window("boundary", 100, second),
        Algorithm::TokenBucket => Policy::token_bucket("boundary", 100, 100, second),
        _ => Policy::sliding_log("boundary", 100, second),
    }
    .expect("the boundary test's policies are valid")
}

/// Maps the deciding clock's microseconds onto local instants.
#[derive(Debug, Clone, Copy)]
struct Timeline {
    origin: Instant,
    origin_us: u64,
}

impl Timeline {
    fn now_us(&self) -> u64 {
        self.origin_us + u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(0)
    }

    fn instant(&self, clock_us: u64) -> Instant {
        if clock_us >= self.origin_us {
            self.origin + Duration::from_micros(clock_us - self.origin_us)
        } else {
            self.origin - Duration::from_micros(self.origin_us - clock_us)
        }
    }
}

/// The memory store's clock ticks whole milliseconds on `Instant`: catch a tick.
fn memory_timeline(clock: &MonotonicClock) -> Timeline {
    let first = clock.now_ms();
    loop {
        let now = clock.now_ms();
        if now != first {
            return Timeline {
                origin: Instant::now(),
                origin_us: now * 1_000,
            };
        }
        std::hint::spin_loop();
    }
}

/// Redis `TIME` against the local clock: the sample with the shortest round trip,
/// read at its midpoint. Returns the timeline and that round trip.
async fn redis_timeline(url: &str) -> Result<(Timeline, Duration), Box<dyn Error>> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let mut best: Option<(Timeline, Duration)> = None;
    for _ in 0..200 {
        let sent = Instant::now();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let rtt = sent.elapsed();
        if best.is_none_or(|(_, b)| rtt < b) {
            best = Some((
                Timeline {
                    origin: sent + rtt / 2,
                    origin_us: secs * 1_000_000 + micros,
                },
                rtt,
            ));
        }
    }
    best.ok_or_else(|| "no TIME sample".into())
}

/// One request as sent: when (relative to the boundary), and whether it was admitted.
#[derive(Debug, Clone, Copy)]
struct Sample {
    offset_us: i64,
    allowed: bool,
}

/// One algorithm's run.
#[derive(Debug)]
struct Run {
    algorithm: Algorithm,
    samples: Vec<Sample>,
    /// How late each request left after its instant, sorted.
    late: Vec<Duration>,
    /// Runs made to get one that kept its schedule.
    attempts: u32,
}

impl Run {
    fn end(&self) -> u64 {
        admitted(&self.samples[..PER_SIDE as usize])
    }
    fn start(&self) -> u64 {
        admitted(&self.samples[PER_SIDE as usize..])
    }
}

fn admitted(samples: &[Sample]) -> u64 {
    samples.iter().filter(|s| s.allowed).count() as u64
}

/// Sleeps, then spins the last millisecond (`thread::sleep` alone overshoots),
/// yielding the core meanwhile: on a small machine the runtime's worker and Redis
/// need it.
fn wait_until(at: Instant) {
    loop {
        let now = Instant::now();
        if now >= at {
            return;
        }
        let left = at - now;
        if left > Duration::from_millis(2) {
            std::thread::sleep(left - Duration::from_millis(1));
        } else {
            std::thread::yield_now();
        }
    }
}

fn signed_us(at: Instant, origin: Instant) -> i64 {
    if at >= origin {
        i64::try_from((at - origin).as_micros()).unwrap_or(i64::MAX)
    } else {
        -i64::try_from((origin - at).as_micros()).unwrap_or(i64::MAX)
    }
}

/// Runs the scenario for one algorithm on its next boundary far enough ahead.
///
/// The main thread (not a runtime worker) keeps the schedule and hands each pending
/// decision to the runtime: no request waits for an earlier answer.
fn run<S: Store>(
    rt: &Runtime,
    store: S,
    algorithm: Algorithm,
    timeline: Timeline,
    lead: Duration,
) -> Result<Run, Box<dyn Error>> {
    let limiter = Limiter::new(store, policy(algorithm));
    let subject = Subject::new(format!(
        "boundary:{algorithm}:{}:{}",
        std::process::id(),
        timeline.now_us()
    ));
    let first_us = timeline.now_us() + SETUP_US + END_SPAN_US;
    let boundary_us = first_us.div_ceil(1_000_000) * 1_000_000;
    let boundary = timeline.instant(boundary_us);
    // The instants of src/algorithm/mod.rs's boundary_times, to the microsecond.
    let offsets = (0..PER_SIDE)
        .map(|i| -((END_SPAN_US - i * END_SPAN_US / PER_SIDE) as i64))
        .chain((0..PER_SIDE).map(|i| (i * START_SPAN_US / PER_SIDE) as i64));
    let mut pending = Vec::with_capacity(2 * PER_SIDE as usize);
    let mut late = Vec::with_capacity(2 * PER_SIDE as usize);
    for offset in offsets {
        let at = if offset >= 0 {
            boundary + Duration::from_micros(offset.unsigned_abs())
        } else {
            boundary - Duration::from_micros(offset.unsigned_abs())
        } - lead;
        wait_until(at);
        let sent = Instant::now();
        late.push(sent - at);
        let check = limiter.check(subject.clone(), 1);
        pending.push((signed_us(sent + lead, boundary), rt.spawn(check)));
    }
    let samples = rt.block_on(async {
        let mut samples = Vec::with_capacity(pending.len());
        for (offset_us, task) in pending {
            let decision = task.await??;
            samples.push(Sample {
                offset_us,
                allowed: decision.is_allowed(),
            });
        }
        Ok::<_, Box<dyn Error>>(samples)
    })?;
    late.sort();
    Ok(Run {
        algorithm,
        samples,
        late,
        attempts: 1,
    })
}

/// Runs `attempt` until a run keeps its schedule within [`SLIP`], at most
/// [`ATTEMPTS`] times; keeps the run that slipped least.
fn on_schedule(
    mut attempt: impl FnMut() -> Result<Run, Box<dyn Error>>,
) -> Result<Run, Box<dyn Error>> {
    let slip = |r: &Run| r.late.last().copied().unwrap_or_default();
    let mut best = attempt()?;
    for n in 2..=ATTEMPTS {
        if slip(&best) <= SLIP {
            break;
        }
        let next = attempt()?;
        if slip(&next) < slip(&best) {
            best = next;
        }
        best.attempts = n;
    }
    Ok(best)
}

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let mut plot_path = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--plot" => plot_path = Some(args.next().ok_or("--plot needs a path")?),
            _ => {
                return Err(
                    format!("unknown argument {arg:?}; usage: boundary [--plot PATH]").into(),
                )
            }
        }
    }
    // One worker: the main thread keeps the schedule, the worker sends and reads.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let _guard = rt.enter();

    let mut runs = Vec::new();
    let what = match std::env::var("REDIS_URL") {
        Ok(url) => {
            let pool = deadpool_redis::Config::from_url(url.as_str())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
            let store = RedisStore::new(pool).timeout(Duration::from_secs(2));
            // Open the store's connection and load the script before any run.
            let warm = Limiter::new(store.clone(), policy(Algorithm::FixedWindow));
            let mut rtts = Vec::new();
            for i in 0..50 {
                let sent = Instant::now();
                rt.block_on(warm.check(format!("boundary:warm-up:{i}"), 1))?;
                rtts.push(sent.elapsed());
            }
            rtts.sort();
            let (timeline, time_rtt) = rt.block_on(redis_timeline(&url))?;
            // The script reads TIME about half a round trip after the request leaves.
            let lead = rtts[rtts.len() / 2] / 2;
            // Calendar quotas need the `calendar` feature, which this package leaves off.
            for algorithm in Algorithm::ALL
                .into_iter()
                .filter(|a| *a != Algorithm::Calendar)
            {
                runs.push(on_schedule(|| {
                    run(&rt, store.clone(), algorithm, timeline, lead)
                })?);
            }
            format!(
                "Redis store at {url}, Redis TIME (TIME round trip {} us, sent {} us early)",
                time_rtt.as_micros(),
                lead.as_micros()
            )
        }
        Err(_) => {
            // Calendar quotas need the `calendar` feature, which this package leaves off.
            for algorithm in Algorithm::ALL
                .into_iter()
                .filter(|a| *a != Algorithm::Calendar)
            {
                runs.push(on_schedule(|| {
                    let clock = MonotonicClock::new();
                    let timeline = memory_timeline(&clock);
                    let store = MemoryStore::with_clock(clock);
                    run(&rt, store, algorithm, timeline, Duration::ZERO)
                })?);
            }
            "memory store, monotonic clock".to_owned()
        }
    };

    println!("Boundary test: limit 100/s; 200 requests over the last 130 ms of a window, 200 over the first 20 ms of the next");
    println!("Store: {what}");
    println!();
    println!("| algorithm | end of window | start of next | total | published | send delay p50 / max | runs |");
    println!("|---|---|---|---|---|---|---|");
    let mut off = Vec::new();
    for r in &runs {
        let (end, start, total) = (r.end(), r.start(), r.end() + r.start());
        let common = expected(r.algorithm);
        println!(
            "| {} | {end} | {start} | {total} | {} + {} = {} | {} / {} us | {} |",
            r.algorithm.as_str().replace('_', " "),
            common.0,
            common.1,
            common.2,
            r.late[r.late.len() / 2].as_micros(),
            r.late.last().map_or(0, Duration::as_micros),
            r.attempts,
        );
        if total.abs_diff(common.2) > tolerance(r.algorithm) {
            off.push(format!(
                "{} total {total}, expected {} (within {})",
                r.algorithm,
                common.2,
                tolerance(r.algorithm)
            ));
        }
    }
    println!();
    for r in &runs {
        println!(
            "boundary {} end={} start={} total={}",
            r.algorithm,
            r.end(),
            r.start(),
            r.end() + r.start()
        );
    }
    if let Some(path) = plot_path {
        plot(&path, &runs, &what)?;
        println!("plot written to {path}");
    }
    if !off.is_empty() {
        eprintln!("totals off: {}", off.join("; "));
        std::process::exit(1);
    }
    Ok(())
}

/// Cumulative admitted requests against time from the boundary, one line per algorithm.
fn plot(path: &str, runs: &[Run], what: &str) -> Result<(), Box<dyn Error>> {
    use plotters::prelude::*;

    let colors = [
        RGBColor(214, 39, 40),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
    ];
    let root = SVGBackend::new(path, (860, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Admitted requests around a window boundary (limit 100/s)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(52)
        .build_cartesian_2d(-140f64..30f64, 0f64..220f64)?;
    chart
        .configure_mesh()
        .x_desc(format!(
            "ms from the window boundary ({})",
            if what.starts_with("Redis") {
                "Redis store, decided on Redis TIME"
            } else {
                "memory store, monotonic clock"
            }
        ))
        .y_desc("admitted so far")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart.draw_series(LineSeries::new(
        [(0.0, 0.0), (0.0, 220.0)],
        BLACK.mix(0.4).stroke_width(1),
    ))?;
    chart.draw_series(LineSeries::new(
        [(-140.0, 100.0), (30.0, 100.0)],
        BLACK.mix(0.2).stroke_width(1),
    ))?;
    let note = ("sans-serif", 13).into_font().color(&BLACK.mix(0.6));
    chart.draw_series([
        Text::new("window boundary", (1.0, 214.0), note.clone()),
        Text::new("limit 100", (-139.0, 104.0), note),
    ])?;
    // Lines that coincide (every algorithm admits the first 100) are drawn from
    // widest to narrowest, so each stays visible under the next.
    for ((r, color), width) in runs.iter().zip(colors).zip([6, 4, 3, 2]) {
        let mut points = vec![(-140.0, 0.0)];
        let mut count = 0.0;
        for s in &r.samples {
            let x = s.offset_us as f64 / 1_000.0;
            if s.allowed {
                points.push((x, count));
                count += 1.0;
                points.push((x, count));
            }
        }
        points.push((30.0, count));
        let label = format!(
            "{}: {} + {} = {}",
            r.algorithm,
            r.end(),
            r.start(),
            r.end() + r.start()
        );
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(width)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK.mix(0.3))
        .background_style(WHITE.mix(0.9))
        .draw()?;
    root.present()?;
    Ok(())
}
