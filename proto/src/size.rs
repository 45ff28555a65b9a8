//! Sizes as people type them and read them: the project's one size parser ([`parse_size`],
//! [`parse_size_aligned`]), its one byte formatter ([`Bytes`]), and [`parse_bounded`] for whole
//! numbers. The target's configuration and volume flags, every initiator command line and
//! rblk-bench use them.
//!
//! Single letters are binary, as in fio and qemu-img (`1G` is 2^30, `1.5G` 1.5 x 2^30), and so
//! are `KiB` ... `PiB`; `KB` ... `PB` are decimal (`1MB` is 10^6), and since every size rblk
//! takes is whole blocks, a decimal size must be a multiple of [`BLOCK_SIZE`]: `1MB` is
//! refused with a message that says so and suggests `1MiB`.

use core::fmt;

/// The block size rblk-target serves its volumes with. A multiple of it is a multiple of every
/// smaller power-of-two block size, so a size that is one suits any volume.
pub const BLOCK_SIZE: u32 = 4096;

/// A size that did not parse, or is not whole blocks. Its message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SizeError {
    /// Not a size at all: no number, an unknown suffix, too large.
    Syntax {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A fraction that is not a whole number of bytes (`0.3k`, `1.5`).
    Fraction {
        /// The text given.
        input: String,
    },
    /// Not a multiple of the block size.
    Unaligned {
        /// The text given; None for a number that was not typed (a TOML integer).
        input: Option<String>,
        /// What it comes to.
        bytes: u64,
        /// The block size it must be a multiple of.
        block: u64,
    },
}

impl SizeError {
    /// The error for `bytes`, spelled `input` (if typed), that is not a multiple of `block`.
    pub fn unaligned(input: Option<&str>, bytes: u64, block: u64) -> SizeError {
        SizeError::Unaligned { input: input.map(|s| s.trim().to_owned()), bytes, block }
    }
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::Syntax { input, reason } => write!(f, "{input:?} is not a size: {reason}"),
            SizeError::Fraction { input } => {
                write!(
                    f,
                    "{input:?} is not a whole number of bytes (a fraction must come to whole bytes: 1.5k, not 0.3k)"
                )
            }
            SizeError::Unaligned { input, bytes, block } => {
                match input.as_deref().filter(|s| *s != bytes.to_string()) {
                    Some(s) => write!(f, "{s:?} is {bytes} bytes, not a multiple of the block size {block}")?,
                    None => write!(f, "{bytes} is not a multiple of the block size {block}")?,
                }
                match input.as_deref().and_then(|s| binary_instead(s, *block)) {
                    Some(binary) => write!(f, ": use {binary} (binary) or a multiple of {block}"),
                    None => write!(f, ": use a multiple of {block}"),
                }
            }
        }
    }
}

impl std::error::Error for SizeError {}

/// `1MB` -> `1MiB` when that is a multiple of `block`: the suggestion for a decimal size.
fn binary_instead(input: &str, block: u64) -> Option<String> {
    let s = input.trim();
    let unit = s.len().checked_sub(2).filter(|&at| s.is_char_boundary(at))?;
    let (number, suffix) = s.split_at(unit);
    if !suffix.is_ascii() {
        return None;
    }
    let letter = suffix.chars().next()?.to_ascii_uppercase();
    if !suffix[1..].eq_ignore_ascii_case("b") || !"KMGTP".contains(letter) || number.is_empty() {
        return None;
    }
    let binary = format!("{number}{letter}iB");
    parse_size(&binary).ok().filter(|n| n % block == 0).map(|_| binary)
}

const SUFFIXES: &str =
    "unknown suffix (use k, M, G, T or KiB, MiB, GiB, TiB: powers of 1024; KB, MB, GB, TB: powers of 1000)";

/// Parses a byte count: a number, whole or with a fraction, and an optional suffix. `k`, `M`,
/// `G`, `T`, `P` (either case) and `KiB` ... `PiB` are powers of 1024; `KB` ... `PB` are
/// powers of 1000 and must come to a multiple of [`BLOCK_SIZE`] (`1MB` does not: the message
/// suggests `1MiB`); `B` or no suffix are bytes. A fraction must come to whole bytes.
///
/// ```
/// use rblk_proto::parse_size;
/// assert_eq!(parse_size("4k"), Ok(4096));
/// assert_eq!(parse_size("1.5G"), Ok(3 << 29));
/// assert_eq!(parse_size("1GiB"), Ok(1 << 30));
/// assert_eq!(parse_size("4096KB"), Ok(4_096_000));
/// assert_eq!(
///     parse_size("1MB").unwrap_err().to_string(),
///     "\"1MB\" is 1000000 bytes, not a multiple of the block size 4096: use 1MiB (binary) or a multiple of 4096"
/// );
/// assert!(parse_size("1X").unwrap_err().to_string().contains("unknown suffix"));
/// ```
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let s = text.trim();
    let syntax = |reason| SizeError::Syntax { input: s.to_owned(), reason };
    let digits = s.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
    let (number, suffix) = s.split_at(digits);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) || fraction.contains('.') {
        return Err(syntax("it does not start with a number"));
    }
    let (scale, decimal): (u128, bool) = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => (1, false),
        "k" | "kib" => (1 << 10, false),
        "m" | "mib" => (1 << 20, false),
        "g" | "gib" => (1 << 30, false),
        "t" | "tib" => (1 << 40, false),
        "p" | "pib" => (1 << 50, false),
        "kb" => (1_000, true),
        "mb" => (1_000_000, true),
        "gb" => (1_000_000_000, true),
        "tb" => (1_000_000_000_000, true),
        "pb" => (1_000_000_000_000_000, true),
        _ => return Err(syntax(SUFFIXES)),
    };
    let too_large = || syntax("it does not fit in 64 bits");
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    let fraction = fraction.trim_end_matches('0');
    // More digits than that cannot come to whole bytes with any suffix (at most 2^50).
    if fraction.len() > 30 {
        return Err(SizeError::Fraction { input: s.to_owned() });
    }
    let tenths = 10u128.pow(fraction.len() as u32);
    let part = if fraction.is_empty() { 0 } else { fraction.parse::<u128>().map_err(|_| too_large())? };
    let part = part.checked_mul(scale).ok_or_else(too_large)?;
    if part % tenths != 0 {
        return Err(SizeError::Fraction { input: s.to_owned() });
    }
    let bytes = whole.checked_mul(scale).and_then(|b| b.checked_add(part / tenths)).ok_or_else(too_large)?;
    let bytes = u64::try_from(bytes).map_err(|_| too_large())?;
    if decimal && bytes % u64::from(BLOCK_SIZE) != 0 {
        return Err(SizeError::unaligned(Some(s), bytes, BLOCK_SIZE.into()));
    }
    Ok(bytes)
}

/// [`parse_size`] for a value that must be whole blocks of `block` bytes (a volume's size,
/// an offset or length of I/O): any other is refused, with a message that names the block size.
///
/// ```
/// use rblk_proto::parse_size_aligned;
/// assert_eq!(parse_size_aligned("64M", 4096), Ok(64 << 20));
/// assert_eq!(
///     parse_size_aligned("6k", 4096).unwrap_err().to_string(),
///     "\"6k\" is 6144 bytes, not a multiple of the block size 4096: use a multiple of 4096"
/// );
/// ```
pub fn parse_size_aligned(text: &str, block: u64) -> Result<u64, SizeError> {
    let bytes = parse_size(text)?;
    check_aligned(Some(text), bytes, block)?;
    Ok(bytes)
}

/// Refuses `bytes` (spelled `input`, if it was typed) unless it is whole blocks of `block`
/// bytes: the one check and message behind [`parse_size_aligned`], for sizes that come as
/// numbers (a TOML integer, a size from elsewhere).
pub fn check_aligned(input: Option<&str>, bytes: u64, block: u64) -> Result<(), SizeError> {
    if block != 0 && bytes.is_multiple_of(block) {
        Ok(())
    } else {
        Err(SizeError::unaligned(input, bytes, block))
    }
}

/// A byte count for people, the one formatter of every program's output. `{}` is exact, in
/// the largest binary unit that divides it (`1 GiB`, `1536 KiB`, `1000 bytes`); a precision
/// rounds in the largest unit it reaches instead (`{:.1}`: `1.5 KiB`, `3.0 MiB`; whole units
/// stay whole, `4 KiB`); `{:#}` leaves out the space, as fio writes (`4KiB`, `100B`).
///
/// ```
/// use rblk_proto::Bytes;
/// assert_eq!(Bytes(1 << 30).to_string(), "1 GiB");
/// assert_eq!(Bytes(1536 << 10).to_string(), "1536 KiB");
/// assert_eq!(Bytes(1000).to_string(), "1000 bytes");
/// assert_eq!(format!("{:.1}", Bytes(1536)), "1.5 KiB");
/// assert_eq!(format!("{:#.1}", Bytes(4096)), "4KiB");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let n = self.0;
        let fits = |shift: u32| n >> shift > 0 || shift == 0;
        let shift = match f.precision() {
            Some(_) => (0..UNITS.len() as u32).rev().map(|u| u * 10).find(|&s| fits(s)).unwrap_or(0),
            None => (0..UNITS.len() as u32)
                .rev()
                .map(|u| u * 10)
                .find(|&s| fits(s) && n.is_multiple_of(1 << s))
                .unwrap_or(0),
        };
        let unit = UNITS[(shift / 10) as usize];
        let space = if f.alternate() { "" } else { " " };
        let unit = match (unit, f.alternate()) {
            ("B", false) if n == 1 => "byte",
            ("B", false) => "bytes",
            (u, _) => u,
        };
        match f.precision() {
            Some(p) if !n.is_multiple_of(1 << shift) => {
                write!(f, "{:.p$}{space}{unit}", n as f64 / (1u64 << shift) as f64)
            }
            _ => write!(f, "{}{space}{unit}", n >> shift),
        }
    }
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
            ("4kib", 4096),
            ("1M", 1 << 20),
            ("1m", 1 << 20),
            ("1MiB", 1 << 20),
            ("1G", 1 << 30),
            ("3g", 3 << 30),
            ("2T", 2 << 40),
            ("1P", 1 << 50),
            ("512b", 512),
            ("512B", 512),
            (" 8k ", 8192),
            // Fractions that come to whole bytes.
            ("1.5G", 3 << 29),
            ("1.5M", 3 << 19),
            ("0.5k", 512),
            ("2.0", 2),
            ("1.25GiB", 5 << 28),
            ("1.", 1),
            // Decimal units that are whole blocks.
            ("4096KB", 4_096_000),
            ("4096kb", 4_096_000),
            ("1TB", 1_000_000_000_000),
            ("64GB", 64_000_000_000),
            ("8.192KB", 8192),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for (text, why) in [
            ("", "does not start with a number"),
            ("k", "does not start with a number"),
            ("-1", "does not start with a number"),
            (".5k", "does not start with a number"),
            ("1.2.3k", "does not start with a number"),
            ("4x", "unknown suffix"),
            ("4kk", "unknown suffix"),
            ("4KiBB", "unknown suffix"),
            ("1 G", "unknown suffix"),
            ("1µB", "unknown suffix"),
            ("99999999999999999999", "64 bits"),
            ("16777216T", "64 bits"),
            ("1.5", "whole number of bytes"),
            ("0.3k", "whole number of bytes"),
            ("1.0000000000000000000000000000001G", "whole number of bytes"),
            ("1MB", "not a multiple of the block size 4096"),
            ("1GB", "not a multiple of the block size 4096"),
            ("1kB", "not a multiple of the block size 4096"),
        ] {
            let e = parse_size(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
            assert!(e.starts_with(&format!("{:?}", text.trim())), "the input is quoted: {e}");
        }
    }

    #[test]
    fn decimal_sizes_suggest_the_binary_unit_when_it_is_whole_blocks() {
        let e = |t: &str| parse_size(t).unwrap_err().to_string();
        assert_eq!(
            e("1MB"),
            "\"1MB\" is 1000000 bytes, not a multiple of the block size 4096: use 1MiB (binary) or a multiple of 4096"
        );
        assert!(e("1.5GB").ends_with("use 1.5GiB (binary) or a multiple of 4096"), "{}", e("1.5GB"));
        // 3 KiB is not whole blocks either: no suggestion of it.
        assert_eq!(e("3KB"), "\"3KB\" is 3000 bytes, not a multiple of the block size 4096: use a multiple of 4096");
    }

    #[test]
    fn aligned_sizes() {
        assert_eq!(parse_size_aligned("64M", 4096), Ok(64 << 20));
        assert_eq!(parse_size_aligned("512", 512), Ok(512));
        let e = parse_size_aligned("12345", 4096).unwrap_err();
        assert_eq!(e.to_string(), "12345 is not a multiple of the block size 4096: use a multiple of 4096");
        assert_eq!(
            parse_size_aligned("6k", 4096).unwrap_err().to_string(),
            "\"6k\" is 6144 bytes, not a multiple of the block size 4096: use a multiple of 4096"
        );
        assert!(matches!(parse_size_aligned("1X", 4096), Err(SizeError::Syntax { .. })));
        assert_eq!(check_aligned(None, 8192, 4096), Ok(()));
        assert_eq!(
            check_aligned(None, 100, 4096).unwrap_err().to_string(),
            "100 is not a multiple of the block size 4096: use a multiple of 4096"
        );
    }

    #[test]
    fn bytes_for_people() {
        for (n, exact, rounded, fio) in [
            (0, "0 bytes", "0 bytes", "0B"),
            (1, "1 byte", "1 byte", "1B"),
            (100, "100 bytes", "100 bytes", "100B"),
            (1000, "1000 bytes", "1000 bytes", "1000B"),
            (4096, "4 KiB", "4 KiB", "4KiB"),
            (1536, "1536 bytes", "1.5 KiB", "1.5KiB"),
            (1536 << 10, "1536 KiB", "1.5 MiB", "1.5MiB"),
            (3 * (1 << 20) + 4096, "3076 KiB", "3.0 MiB", "3.0MiB"),
            (1 << 30, "1 GiB", "1 GiB", "1GiB"),
            (5 << 40, "5 TiB", "5 TiB", "5TiB"),
            (u64::MAX, "18446744073709551615 bytes", "16.0 EiB", "16.0EiB"),
        ] {
            assert_eq!(Bytes(n).to_string(), exact, "{n}");
            assert_eq!(format!("{:.1}", Bytes(n)), rounded, "{n}");
            assert_eq!(format!("{:#.1}", Bytes(n)), fio, "{n}");
        }
    }

    /// What the formatter writes, the parser reads back.
    #[test]
    fn formatted_sizes_parse_back() {
        for n in [0, 512, 4096, 1536 << 10, 1 << 30, 3 << 40, 12345] {
            let text = format!("{:#}", Bytes(n));
            assert_eq!(parse_size(&text), Ok(n), "{text}");
        }
    }
}
