//! Durations as people type them, for every program's flags.

use std::time::Duration;

/// Parses a duration as people type it: `10` and `1.5` are seconds; `10s`, `500ms`, `20us`,
/// `2m`, `1h` say their unit.
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let s = text.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("bad duration {text:?}: expected a number like 10, 1.5s or 500ms"))?;
    let scale = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("bad duration {text:?}: unknown unit {other:?} (use s, ms, us, m or h)")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("bad duration {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        for (text, want) in [
            ("10", Duration::from_secs(10)),
            ("1.5", Duration::from_millis(1500)),
            ("2s", Duration::from_secs(2)),
            ("500ms", Duration::from_millis(500)),
            ("20us", Duration::from_micros(20)),
            ("0", Duration::ZERO),
            ("2m", Duration::from_secs(120)),
        ] {
            assert_eq!(parse_duration(text).unwrap(), want, "{text}");
        }
        for bad in ["", "s", "-1", "10x", "1e3"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
