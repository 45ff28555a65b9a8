//! Sizes and offsets as people type them: `4096`, `4k`, `1M`, `1G`, `2T` (binary multiples).
//! The one parser of the project: the target's configuration and volume flags and every
//! initiator command line use it.

/// Parses a byte count: a decimal number with an optional binary suffix `k`, `M`, `G` or `T`
/// (either case, optionally followed by `iB` or `B`): `4k` is 4096. The error says what is
/// wrong, for a message that quotes the input.
///
/// ```
/// assert_eq!(rblk_proto::parse_size("4k"), Ok(4096));
/// assert_eq!(rblk_proto::parse_size("1GiB"), Ok(1 << 30));
/// assert!(rblk_proto::parse_size("1X").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, &'static str> {
    let s = text.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let (number, suffix) = s.split_at(digits);
    if number.is_empty() {
        return Err("it does not start with a number");
    }
    let number: u64 = number.parse().map_err(|_| "the number is too large")?;
    let mut chars = suffix.chars();
    let shift = match chars.next().map(|c| c.to_ascii_lowercase()) {
        None => return Ok(number),
        Some('b') if chars.as_str().is_empty() => return Ok(number),
        Some('k') => 10,
        Some('m') => 20,
        Some('g') => 30,
        Some('t') => 40,
        Some(_) => return Err("unknown suffix (use k, M, G or T)"),
    };
    if !matches!(chars.as_str(), "" | "iB" | "ib" | "B" | "b") {
        return Err("unknown suffix (use k, M, G or T)");
    }
    number.checked_mul(1 << shift).ok_or("the size does not fit in 64 bits")
}

/// Parses a whole number for a command-line flag that takes `min..=max` (`max` None: no upper
/// bound), with a message in words: `between 5 and 86400`, `at least 5`, not a Rust range.
///
/// ```
/// assert_eq!(rblk_proto::parse_bounded("7", 5, None), Ok(7));
/// assert_eq!(rblk_proto::parse_bounded("1", 5, None).unwrap_err(), "1 is too small: it must be at least 5");
/// assert_eq!(rblk_proto::parse_bounded("0", 1, Some(64)).unwrap_err(), "0 is out of range: it must be between 1 and 64");
/// ```
pub fn parse_bounded(text: &str, min: u64, max: Option<u64>) -> Result<u64, String> {
    let n: u64 = text.trim().parse().map_err(|_| format!("{text:?} is not a whole number"))?;
    match max {
        Some(max) if n < min || n > max => Err(format!("{n} is out of range: it must be between {min} and {max}")),
        None if n < min => Err(format!("{n} is too small: it must be at least {min}")),
        _ => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        for (text, want) in [
            ("0", 0),
            ("4096", 4096),
            ("4k", 4096),
            ("4K", 4096),
            ("4KiB", 4096),
            ("1M", 1 << 20),
            ("1m", 1 << 20),
            ("1MB", 1 << 20),
            ("1G", 1 << 30),
            ("3g", 3 << 30),
            ("2T", 2 << 40),
            ("512b", 512),
            (" 8k ", 8192),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for (text, why) in [
            ("", "number"),
            ("k", "number"),
            ("-1", "number"),
            ("1.5G", "suffix"),
            ("4x", "suffix"),
            ("4kk", "suffix"),
            ("1 G", "suffix"),
            ("99999999999999999999", "too large"),
            ("16777216T", "64 bits"),
        ] {
            let e = parse_size(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
