//! Sizes and offsets as people type them: [`rblk_proto::parse_size`] with this crate's error.

use crate::{Error, Result};

/// Parses a byte count with the project's one size parser ([`rblk_proto::parse_size`]): `4k`,
/// `1.5M`, `1GiB` (powers of 1024), `4096KB` (powers of 1000, refused unless whole blocks of
/// [`BLOCK_SIZE`](rblk_proto::BLOCK_SIZE)), with [`Error::Size`] quoting the input.
///
/// ```
/// assert_eq!(rblk_initiator::parse_size("4k")?, 4096);
/// assert_eq!(rblk_initiator::parse_size("1GiB")?, 1 << 30);
/// assert_eq!(rblk_initiator::parse_size("1.5M")?, 3 << 19);
/// # Ok::<(), rblk_initiator::Error>(())
/// ```
pub fn parse_size(text: &str) -> Result<u64> {
    rblk_proto::parse_size(text).map_err(Error::Size)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_error_quotes_the_input() {
        let e = super::parse_size("4x").unwrap_err().to_string();
        assert!(e.contains("\"4x\"") && e.contains("unknown suffix"), "{e}");
        let e = super::parse_size("1MB").unwrap_err().to_string();
        assert!(e.contains("not a multiple of the block size 4096: use 1MiB"), "{e}");
    }
}
