//! Durations as people type them and read them: the one duration parser of every program's
//! flags and of the target's configuration ([`parse_duration`], [`parse_duration_bounded`]),
//! and [`format_duration`] for messages.
//!
//! The syntax is humantime's (`500ms`, `15s`, `2m`, `1h`, `1m30s`, `1h 30min`, `2days`) with
//! two additions humantime does not have: a bare number is seconds (`15`, as every flag took
//! before units), and a number may have a fraction (`1.5s`, `0.5h`, a bare `2.5`). Months and
//! years are left out: humantime's `M` (month) is one shift key away from `m` (minute).

use core::time::Duration;

const NANOS: [(&[&str], u128); 7] = [
    (&["ns", "nsec", "nsecs"], 1),
    (&["us", "µs", "usec", "usecs"], 1_000),
    (&["ms", "msec", "msecs"], 1_000_000),
    (&["s", "sec", "secs", "second", "seconds"], 1_000_000_000),
    (&["m", "min", "mins", "minute", "minutes"], 60_000_000_000),
    (&["h", "hr", "hrs", "hour", "hours"], 3_600_000_000_000),
    (&["d", "day", "days"], 86_400_000_000_000),
];

const EXAMPLES: &str = "e.g. 500ms, 15s, 2m, 1h30m";

/// Parses a duration: numbers with a unit (`500ms`, `15s`, `2m`, `1h`, `1m30s`; `ns`, `us`,
/// `ms`, `s`, `m` or `min`, `h`, `d` and their long names), a fraction allowed (`1.5s`); a
/// bare number is seconds (`15`, `2.5`). The error says what is wrong and quotes the input.
///
/// ```
/// use std::time::Duration;
/// use rblk_proto::parse_duration;
/// assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
/// assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
/// assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
/// assert!(parse_duration("soon").unwrap_err().contains("\"soon\" is not a duration"));
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_duration_in(text, Duration::from_secs(1))
}

/// [`parse_duration`] for a flag whose bare number counts `bare` (a flag that took
/// milliseconds before it took units keeps that meaning: `Duration::from_millis(1)`).
///
/// ```
/// use std::time::Duration;
/// let ms = Duration::from_millis(1);
/// assert_eq!(rblk_proto::parse_duration_in("250", ms), Ok(Duration::from_millis(250)));
/// assert_eq!(rblk_proto::parse_duration_in("2s", ms), Ok(Duration::from_secs(2)));
/// ```
pub fn parse_duration_in(text: &str, bare: Duration) -> Result<Duration, String> {
    let s = text.trim();
    let bad = |why: &str| {
        let bare = match bare {
            d if d == Duration::from_secs(1) => "seconds".to_owned(),
            d if d == Duration::from_millis(1) => "milliseconds".to_owned(),
            d => format!("in units of {}", format_duration(d)),
        };
        format!("{s:?} is not a duration: {why} ({EXAMPLES}; a bare number is {bare})")
    };
    if s.is_empty() {
        return Err(bad("it does not start with a number"));
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let nanos = number(s, bare.as_nanos()).ok_or_else(|| bad(&number_error(s)))?;
        return to_duration(nanos).ok_or_else(|| bad("too long"));
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (digits, after) = rest.split_at(n);
        if digits.is_empty() {
            return Err(bad(if total == 0 { "it does not start with a number" } else { "expected a number" }));
        }
        let after = after.trim_start();
        let u = after.find(|c: char| !c.is_alphabetic()).unwrap_or(after.len());
        let (unit, after) = after.split_at(u);
        if unit.is_empty() {
            return Err(bad(&format!("{digits} has no unit (a bare number must stand alone)")));
        }
        let scale = NANOS
            .iter()
            .find(|(names, _)| names.contains(&unit))
            .map(|&(_, ns)| ns)
            .ok_or_else(|| bad(&format!("unknown unit {unit:?} (use ns, us, ms, s, m, h or d)")))?;
        let nanos = number(digits, scale).ok_or_else(|| bad(&number_error(digits)))?;
        total = total.checked_add(nanos).ok_or_else(|| bad("too long"))?;
        rest = after.trim_start();
    }
    to_duration(total).ok_or_else(|| bad("too long"))
}

/// `digits` (whole, or with a fraction) times `scale` nanoseconds, rounded down to whole
/// nanoseconds; None for a malformed or huge number.
fn number(digits: &str, scale: u128) -> Option<u128> {
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() || fraction.contains('.') {
        return None;
    }
    let fraction = &fraction.trim_end_matches('0')[..fraction.trim_end_matches('0').len().min(30)];
    let whole: u128 = whole.parse().ok()?;
    let part: u128 = if fraction.is_empty() { 0 } else { fraction.parse().ok()? };
    let part = part.checked_mul(scale)? / 10u128.pow(fraction.len() as u32);
    whole.checked_mul(scale)?.checked_add(part)
}

fn number_error(digits: &str) -> String {
    if digits.starts_with('.') || digits.matches('.').count() > 1 {
        format!("{digits:?} is not a number")
    } else {
        "too long".to_owned()
    }
}

fn to_duration(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// [`parse_duration`] for a flag that takes `min..=max` (`max` None: no upper bound), with the
/// range in words as [`parse_bounded`](crate::parse_bounded) says it.
///
/// ```
/// use std::time::Duration;
/// use rblk_proto::parse_duration_bounded;
/// let day = Some(Duration::from_secs(86_400));
/// assert_eq!(parse_duration_bounded("30s", Duration::from_secs(5), day), Ok(Duration::from_secs(30)));
/// assert_eq!(
///     parse_duration_bounded("1", Duration::from_secs(5), day).unwrap_err(),
///     "1 s is out of range: it must be between 5 s and 1 day"
/// );
/// ```
pub fn parse_duration_bounded(text: &str, min: Duration, max: Option<Duration>) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    check_duration(d, min, max)?;
    Ok(d)
}

/// Refuses a duration outside `min..=max` (`max` None: no upper bound), in words: `between
/// 5 s and 1 day`, `at least 5 s`, `at most 1 day` (a zero `min` with a `max`). The one check
/// behind [`parse_duration_bounded`], for durations that come from elsewhere (a TOML integer).
pub fn check_duration(d: Duration, min: Duration, max: Option<Duration>) -> Result<(), String> {
    let (got, lo) = (format_duration(d), format_duration(min));
    match max {
        Some(max) if min.is_zero() && d > max => {
            Err(format!("{got} is too long: it must be at most {}", format_duration(max)))
        }
        Some(max) if d < min || d > max => {
            Err(format!("{got} is out of range: it must be between {lo} and {}", format_duration(max)))
        }
        None if d < min => Err(format!("{got} is too short: it must be at least {lo}")),
        _ => Ok(()),
    }
}

/// A duration in words for messages, exact, in the largest unit that divides it: `15 s`,
/// `90 s`, `2 min`, `1 h`, `1 day`, `2 days`, `500 ms`, `20 us`, `0 s`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(rblk_proto::format_duration(Duration::from_secs(86_400)), "1 day");
/// assert_eq!(rblk_proto::format_duration(Duration::from_millis(1500)), "1500 ms");
/// ```
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0 s".to_owned();
    }
    const UNITS: [(u128, &str); 7] = [
        (86_400_000_000_000, "day"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "min"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let (scale, unit) = UNITS.into_iter().find(|(scale, _)| nanos.is_multiple_of(*scale)).unwrap_or((1, "ns"));
    let n = nanos / scale;
    let plural = if unit == "day" && n != 1 { "s" } else { "" };
    format!("{n} {unit}{plural}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn durations() {
        for (text, want) in [
            ("10", Duration::from_secs(10)),
            ("0", Duration::ZERO),
            ("1.5", Duration::from_millis(1500)),
            ("2s", Duration::from_secs(2)),
            ("15 s", Duration::from_secs(15)),
            ("1.5s", Duration::from_millis(1500)),
            ("500ms", Duration::from_millis(500)),
            ("20us", Duration::from_micros(20)),
            ("20µs", Duration::from_micros(20)),
            ("7ns", Duration::from_nanos(7)),
            ("2m", Duration::from_secs(120)),
            ("2min", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3600)),
            ("0.5h", Duration::from_secs(1800)),
            ("1d", Duration::from_secs(86_400)),
            ("2days", Duration::from_secs(172_800)),
            ("1m30s", Duration::from_secs(90)),
            ("1h 30min", Duration::from_secs(5400)),
            ("1 hour 2 minutes 3 seconds", Duration::from_secs(3723)),
            (" 15s ", Duration::from_secs(15)),
            ("0.0000000015s", Duration::from_nanos(1)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for (text, why) in [
            ("", "does not start with a number"),
            ("s", "does not start with a number"),
            ("-1", "does not start with a number"),
            ("soon", "does not start with a number"),
            ("10x", "unknown unit \"x\""),
            ("1M", "unknown unit \"M\""),
            ("1y", "unknown unit"),
            ("1e3", "unknown unit"),
            ("1m30", "30 has no unit"),
            ("1m-30s", "expected a number"),
            (".5s", "is not a number"),
            ("1.2.3", "is not a number"),
            ("99999999999999999999999s", "too long"),
            ("18446744073709551616", "too long"),
        ] {
            let e = parse_duration(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
            assert!(e.starts_with(&format!("{:?} is not a duration", text.trim())), "{e}");
            assert!(e.contains("a bare number is seconds"), "{e}");
        }
    }

    #[test]
    fn a_flag_may_keep_milliseconds_for_bare_numbers() {
        assert_eq!(parse_duration_in("250", MS), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration_in("2.5", MS), Ok(Duration::from_micros(2500)));
        assert_eq!(parse_duration_in("1s", MS), Ok(Duration::from_secs(1)));
        assert!(parse_duration_in("x", MS).unwrap_err().contains("a bare number is milliseconds"));
    }

    #[test]
    fn ranges_in_words() {
        let (s5, day) = (Duration::from_secs(5), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_duration_bounded("1m", s5, day), Ok(Duration::from_secs(60)));
        assert_eq!(
            parse_duration_bounded("1", s5, day).unwrap_err(),
            "1 s is out of range: it must be between 5 s and 1 day"
        );
        assert_eq!(
            parse_duration_bounded("2d", s5, day).unwrap_err(),
            "2 days is out of range: it must be between 5 s and 1 day"
        );
        assert_eq!(parse_duration_bounded("4s", s5, None).unwrap_err(), "4 s is too short: it must be at least 5 s");
        assert_eq!(
            parse_duration_bounded("25h", Duration::ZERO, day).unwrap_err(),
            "25 h is too long: it must be at most 1 day"
        );
        assert!(parse_duration_bounded("soon", s5, day).unwrap_err().contains("not a duration"));
    }

    #[test]
    fn durations_in_words() {
        for (d, want) in [
            (Duration::ZERO, "0 s"),
            (Duration::from_secs(15), "15 s"),
            (Duration::from_secs(90), "90 s"),
            (Duration::from_secs(120), "2 min"),
            (Duration::from_secs(3600), "1 h"),
            (Duration::from_secs(172_800), "2 days"),
            (Duration::from_millis(500), "500 ms"),
            (Duration::from_micros(20), "20 us"),
            (Duration::from_nanos(7), "7 ns"),
        ] {
            assert_eq!(format_duration(d), want);
            // What the formatter writes, the parser reads back.
            assert_eq!(parse_duration(&want.replace(' ', "")), Ok(d), "{want}");
        }
    }
}
