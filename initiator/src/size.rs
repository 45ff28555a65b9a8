//! Sizes and offsets as people type them: [`rblk_proto::parse_size`] with this crate's error.

use crate::{Error, Result};

/// Parses a byte count: a decimal number with an optional binary suffix `k`, `M`, `G` or `T`
/// (either case, optionally followed by `iB` or `B`): `4k` is 4096. The project's one size
/// parser ([`rblk_proto::parse_size`]), with [`Error::Size`] naming the input.
///
/// ```
/// assert_eq!(rblk_initiator::parse_size("4k")?, 4096);
/// assert_eq!(rblk_initiator::parse_size("1GiB")?, 1 << 30);
/// # Ok::<(), rblk_initiator::Error>(())
/// ```
pub fn parse_size(text: &str) -> Result<u64> {
    rblk_proto::parse_size(text).map_err(|reason| Error::Size { input: text.to_owned(), reason })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_error_quotes_the_input() {
        let e = super::parse_size("4x").unwrap_err().to_string();
        assert!(e.contains("\"4x\"") && e.contains("unknown suffix"), "{e}");
    }
}
