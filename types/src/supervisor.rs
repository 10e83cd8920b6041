//! The parts of a supervisor spec that the host's supervisor reads and the guest SDK's
//! builder writes, one definition for both sides: [`Strategy`], [`Restart`],
//! [`Shutdown`], [`AutoShutdown`] and [`Backoff`], with the JSON the host reads (names in
//! `snake_case`, durations as text: [`duration_text`]).
//!
//! ```
//! use core::time::Duration;
//! use wasmproc_types::supervisor::{Backoff, Shutdown, Strategy};
//!
//! assert_eq!(Strategy::RestForOne.name(), "rest_for_one");
//! let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
//! assert_eq!(backoff.base_delay(3), Duration::from_millis(400));
//! assert_eq!(Shutdown::default(), Shutdown::Timeout(Duration::from_secs(5)));
//! ```

use core::time::Duration;

use alloc::string::String;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Which children a child's restart takes with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Only the child that ended is restarted.
    OneForOne,
    /// Every other child is stopped (in reverse start order), then all are started again
    /// in order.
    OneForAll,
    /// The children started after the one that ended are stopped (in reverse order),
    /// then it and they are started again in order.
    RestForOne,
    /// A pool of children of one template, added at run time by `start_child`, each
    /// restarted on its own as in `one_for_one`.
    SimpleOneForOne,
}

impl Strategy {
    /// The strategy's name as a spec writes it.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::OneForOne => "one_for_one",
            Strategy::OneForAll => "one_for_all",
            Strategy::RestForOne => "rest_for_one",
            Strategy::SimpleOneForOne => "simple_one_for_one",
        }
    }
}

/// When a child that ended is started again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restart {
    /// Always (the default).
    #[default]
    Permanent,
    /// Only after an abnormal end: an error, a trap, a termination; not after it ended
    /// normally or was shut down.
    Transient,
    /// Never; its spec is forgotten once it has ended.
    Temporary,
}

impl Restart {
    /// The restart type's name as a spec writes it.
    pub fn name(self) -> &'static str {
        match self {
            Restart::Permanent => "permanent",
            Restart::Transient => "transient",
            Restart::Temporary => "temporary",
        }
    }
}

/// How a child is stopped: by the supervisor's end, a strategy's restart or
/// `terminate_child`. Written `"brutal"` or as a timeout (`"5s"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    /// Ended at once.
    Brutal,
    /// Asked to end, and ended at once if it has not within this long.
    Timeout(Duration),
}

impl Default for Shutdown {
    /// A 5 s timeout, as OTP's default for a worker.
    fn default() -> Self {
        Shutdown::Timeout(Duration::from_secs(5))
    }
}

/// Whether the end of significant children ends the supervisor (OTP's `auto_shutdown`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoShutdown {
    /// Never (the default): no child may be significant.
    #[default]
    Never,
    /// When any significant child ends and is not restarted.
    AnySignificant,
    /// When every significant child has ended and none is restarted.
    AllSignificant,
}

/// The delay before a restart: `min(max, initial × multiplier^(n-1))` before the `n`th
/// restart within the current `period`, shortened at random by up to `jitter` of itself,
/// so that restarts of many children spread out. The count starts again once a `period`
/// passes without restarts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backoff {
    /// The delay before the first restart. By default 0: no delay.
    #[serde(with = "duration_text")]
    pub initial: Duration,
    /// The longest delay. By default 30 s.
    #[serde(with = "duration_text")]
    pub max: Duration,
    /// What each restart multiplies the delay by; at least 1. By default 2.
    pub multiplier: f64,
    /// The fraction of a delay, between 0 and 1, that may be taken off it at random: a
    /// delay `d` becomes one between `d × (1 − jitter)` and `d`. By default 0.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::ZERO, max: Duration::from_secs(30), multiplier: 2.0, jitter: 0.0 }
    }
}

impl Backoff {
    /// Starts at `initial`, doubles up to `max`, no jitter.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, ..Backoff::default() }
    }

    /// What each restart multiplies the delay by; at least 1 (the host refuses less).
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The fraction of each delay, between 0 and 1, taken off at random.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// The delay before restart `n` (1 for the first within the period) before jitter.
    pub fn base_delay(&self, n: u32) -> Duration {
        if self.initial.is_zero() {
            return Duration::ZERO;
        }
        let secs = self.initial.as_secs_f64() * powi(self.multiplier, n.saturating_sub(1));
        if !secs.is_finite() || secs >= self.max.as_secs_f64() {
            return self.max;
        }
        Duration::from_secs_f64(secs).min(self.max)
    }

    /// The delay before restart `n`, jittered by `unit` (a draw in `[0, 1)`): between
    /// `base × (1 − jitter)` and the base.
    pub fn delay(&self, n: u32, unit: f64) -> Duration {
        let base = self.base_delay(n);
        let cut = (self.jitter * unit.clamp(0.0, 1.0)).clamp(0.0, 1.0);
        base.mul_f64(1.0 - cut)
    }
}

/// `base` to the power `exponent`, by squaring (`f64::powi` is not in `core`): at most
/// 64 multiplications.
fn powi(base: f64, exponent: u32) -> f64 {
    let (mut result, mut square, mut rest) = (1.0, base, exponent);
    while rest > 0 {
        if rest & 1 == 1 {
            result *= square;
        }
        square *= square;
        rest >>= 1;
    }
    result
}

impl Serialize for Shutdown {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Shutdown::Brutal => serializer.serialize_str("brutal"),
            Shutdown::Timeout(timeout) => serializer.serialize_str(&duration_text::format(*timeout)),
        }
    }
}

impl<'de> Deserialize<'de> for Shutdown {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == "brutal" {
            return Ok(Shutdown::Brutal);
        }
        duration_text::parse(&text).map(Shutdown::Timeout).map_err(|_| {
            serde::de::Error::custom(alloc::format!(
                "invalid shutdown `{text}`: expected \"brutal\" or a timeout like \"500ms\" or \"5s\""
            ))
        })
    }
}

/// Durations as a spec writes them: numbers each followed by a unit, `"500ms"`, `"5s"`,
/// `"1m 30s"`. Units: `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`, `d`, `w`, and their
/// long forms (`sec`, `min`, `hours`, …). As a serde `with` module, a field of type
/// `Duration`.
pub mod duration_text {
    use core::time::Duration;

    use alloc::string::{String, ToString};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Each unit, by the names it is written with, in nanoseconds.
    const UNITS: [(&[&str], u64); 8] = [
        (&["ns", "nsec", "nsecs", "nanosecond", "nanoseconds"], 1),
        (&["us", "µs", "usec", "usecs", "microsecond", "microseconds"], 1_000),
        (&["ms", "msec", "msecs", "millisecond", "milliseconds"], 1_000_000),
        (&["s", "sec", "secs", "second", "seconds"], 1_000_000_000),
        (&["m", "min", "mins", "minute", "minutes"], 60_000_000_000),
        (&["h", "hr", "hrs", "hour", "hours"], 3_600_000_000_000),
        (&["d", "day", "days"], 86_400_000_000_000),
        (&["w", "week", "weeks"], 604_800_000_000_000),
    ];

    /// `text` as a duration: one or more whole numbers each followed by a unit, the
    /// parts added up (`"1m 30s"` is 90 s).
    ///
    /// # Errors
    ///
    /// Text that is not that, or a duration past `u64::MAX` seconds, with `text` and
    /// what was wrong in the message.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let fail = |why: &str| {
            alloc::format!("invalid duration `{text}` ({why}): expected a number and a unit, like \"500ms\" or \"5s\"")
        };
        let mut rest = text.trim();
        if rest.is_empty() {
            return Err(fail("it is empty"));
        }
        let mut total: u128 = 0;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            if digits == 0 {
                return Err(fail("a number must come first"));
            }
            let number: u128 = rest[..digits].parse().map_err(|_| fail("the number is too large"))?;
            rest = rest[digits..].trim_start();
            let end = rest.find(|c: char| c.is_ascii_digit() || c.is_whitespace()).unwrap_or(rest.len());
            let unit = &rest[..end];
            let Some((_, nanos)) = UNITS.iter().find(|(names, _)| names.contains(&unit)) else {
                return Err(fail(if unit.is_empty() { "a unit must follow the number" } else { "an unknown unit" }));
            };
            total = number
                .checked_mul(u128::from(*nanos))
                .and_then(|part| total.checked_add(part))
                .ok_or_else(|| fail("too long"))?;
            rest = rest[end..].trim_start();
        }
        let secs = u64::try_from(total / 1_000_000_000).map_err(|_| fail("too long"))?;
        Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
    }

    /// `duration` as [`parse`] reads it: its days, hours, minutes, seconds, milliseconds,
    /// microseconds and nanoseconds that are not zero (`"1h 30m"`, `"1ms 500us"`), or
    /// `"0s"`.
    pub fn format(duration: Duration) -> String {
        if duration.is_zero() {
            return "0s".to_string();
        }
        let parts = [
            (duration.as_secs() / 86_400, "d"),
            (duration.as_secs() / 3_600 % 24, "h"),
            (duration.as_secs() / 60 % 60, "m"),
            (duration.as_secs() % 60, "s"),
            (u64::from(duration.subsec_millis()), "ms"),
            (u64::from(duration.subsec_micros() % 1_000), "us"),
            (u64::from(duration.subsec_nanos() % 1_000), "ns"),
        ];
        let mut text = String::new();
        for (value, unit) in parts.into_iter().filter(|(value, _)| *value > 0) {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&alloc::format!("{value}{unit}"));
        }
        text
    }

    /// Writes `duration` as [`format`] does.
    ///
    /// # Errors
    ///
    /// The serializer's.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format(*duration))
    }

    /// Reads a duration as [`parse`] does.
    ///
    /// # Errors
    ///
    /// Not a string, or text [`parse`] refuses.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::duration_text::{format, parse};
    use super::*;

    #[test]
    fn durations_read_and_write_back() {
        let cases = [
            ("500ms", Duration::from_millis(500)),
            ("5s", Duration::from_secs(5)),
            ("1m 30s", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("2d 3h", Duration::from_secs(2 * 86_400 + 3 * 3600)),
            ("1ms 500us", Duration::from_micros(1500)),
            ("7ns", Duration::from_nanos(7)),
        ];
        for (text, duration) in cases {
            assert_eq!(parse(text), Ok(duration), "{text}");
            assert_eq!(format(duration), text);
        }
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse(" 2 minutes 1sec "), Ok(Duration::from_secs(121)));
        assert_eq!(parse("1500000ns"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse("1w"), Ok(Duration::from_secs(604_800)));
        for (bad, why) in [
            ("soon", "a number must come first"),
            ("5", "a unit must follow the number"),
            ("5 parsecs", "an unknown unit"),
            ("", "it is empty"),
            ("1.5s", "an unknown unit"),
            ("99999999999999999999999w", "too long"),
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.starts_with(&alloc::format!("invalid duration `{bad}` ({why})")), "{error}");
        }
    }

    #[test]
    fn the_backoff_schedule_grows_to_its_max_and_jitter_only_shortens() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).jitter(0.25);
        let base: alloc::vec::Vec<u128> = (1..=6).map(|n| backoff.base_delay(n).as_millis()).collect();
        assert_eq!(base, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.base_delay(u32::MAX), Duration::from_secs(1), "no overflow past the max");
        for n in 1..=6 {
            let base = backoff.base_delay(n);
            assert_eq!(backoff.delay(n, 0.0), base);
            assert_eq!(backoff.delay(n, 1.0), base.mul_f64(0.75));
            let mid = backoff.delay(n, 0.5);
            assert!(mid >= base.mul_f64(0.75) && mid <= base);
        }
        assert_eq!(backoff.multiplier(1.0).base_delay(5), Duration::from_millis(100));
        assert_eq!(Backoff::default().base_delay(3), Duration::ZERO, "no delay by default");
    }
}
