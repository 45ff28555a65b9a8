//! The `--verify` pattern: every volume block written under `--verify` describes itself.
//!
//! ```text
//! bytes 0..8    magic "rblkbnch"
//!       8..16   the block's volume offset (little-endian u64)
//!      16..24   the generation (little-endian u64)
//!      24..32   checksum over bytes 0..24 and 32..end (64-bit multiply-rotate hash of the words)
//!      32..end  filler: a SplitMix64 stream seeded from offset and generation
//! ```
//!
//! A reader that knows nothing about the writer can therefore tell a block that was never
//! written (zeros), foreign data, a torn block (bad checksum), a misdirected write (the offset
//! field names another block) and, when it knows the generation to expect, a lost or stale write.

use std::fmt;

use crate::rng::Rng;

/// The first 8 bytes of every pattern block.
pub const MAGIC: [u8; 8] = *b"rblkbnch";
/// Bytes of the header (magic, offset, generation, checksum).
pub const HEADER_LEN: usize = 32;
/// Smallest block the pattern fits in (the volume's block size must be at least this).
pub const MIN_BLOCK: usize = 64;

fn word(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

fn mix(h: u64, w: u64) -> u64 {
    (h ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
}

fn filler(offset: u64, generation: u64) -> Rng {
    Rng::new(offset.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ generation.wrapping_mul(0xA076_1D64_78BD_642F))
}

const SEED: u64 = 0x7262_6c6b_6265_6e63;

/// Writes the pattern of the block at volume `offset` under `generation` into `block` (its
/// length is the volume's block size: a multiple of 8, at least [`MIN_BLOCK`]).
pub fn fill(block: &mut [u8], offset: u64, generation: u64) {
    debug_assert!(block.len() >= MIN_BLOCK && block.len().is_multiple_of(8));
    block[..8].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&offset.to_le_bytes());
    block[16..24].copy_from_slice(&generation.to_le_bytes());
    let mut h = block[..24].chunks_exact(8).fold(SEED, |h, w| mix(h, word(w)));
    let mut rng = filler(offset, generation);
    for w in block[HEADER_LEN..].chunks_exact_mut(8) {
        let x = rng.next_u64();
        w.copy_from_slice(&x.to_le_bytes());
        h = mix(h, x);
    }
    block[24..32].copy_from_slice(&h.to_le_bytes());
}

/// [`fill`] for each `block_size` block of `buf`, which starts at volume `offset`.
pub fn fill_blocks(buf: &mut [u8], offset: u64, generation: u64, block_size: usize) {
    for (i, block) in buf.chunks_exact_mut(block_size).enumerate() {
        fill(block, offset + (i * block_size) as u64, generation);
    }
}

/// What is wrong with a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// All zeros: never written (with `--verify`).
    Zeros,
    /// No magic: something other than rblk-bench wrote it.
    Foreign,
    /// The header is there but the checksum does not match: torn or partly overwritten.
    Checksum,
    /// The checksum matches but the filler differs from the pattern at this byte.
    Content {
        /// Byte within the block.
        at: usize,
    },
    /// A whole, valid block, but the one written for another offset: a misdirected write.
    Misplaced {
        /// The offset its header names.
        found: u64,
    },
    /// A whole, valid block of another generation: a lost (or stale) write.
    Stale {
        /// Its generation.
        found: u64,
        /// The one expected.
        expected: u64,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Problem::Zeros => f.write_str("all zeros, no rblk-bench pattern (never written with --verify)"),
            Problem::Foreign => f.write_str("foreign data, no rblk-bench pattern (overwritten by something else)"),
            Problem::Checksum => f.write_str("checksum mismatch (torn or partly overwritten block)"),
            Problem::Content { at } => write!(f, "data differs from the pattern at byte {at} of the block"),
            Problem::Misplaced { found } => write!(f, "holds the block written for offset {found} (misdirected write)"),
            Problem::Stale { found, expected } => {
                write!(f, "holds generation {found}, expected {expected} (lost or stale write)")
            }
        }
    }
}

/// A block that failed verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The block's volume offset.
    pub offset: u64,
    /// What is wrong with it.
    pub problem: Problem,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block at offset {} ({:#x}): {}", self.offset, self.offset, self.problem)
    }
}

/// Checks the block read from volume `offset`: a whole pattern block written for that offset,
/// of generation `expected` when given. Returns the block's generation.
pub fn check(block: &[u8], offset: u64, expected: Option<u64>) -> Result<u64, Mismatch> {
    let bad = |problem| Err(Mismatch { offset, problem });
    if block.len() < MIN_BLOCK || block[..8] != MAGIC {
        return bad(if block.iter().all(|&b| b == 0) { Problem::Zeros } else { Problem::Foreign });
    }
    let (found, generation, sum) = (word(&block[8..]), word(&block[16..]), word(&block[24..]));
    let mut h = block[..24].chunks_exact(8).fold(SEED, |h, w| mix(h, word(w)));
    let mut rng = filler(found, generation);
    let mut differs = None;
    for (i, w) in block[HEADER_LEN..].chunks_exact(8).enumerate() {
        let w = word(w);
        h = mix(h, w);
        if w != rng.next_u64() && differs.is_none() {
            differs = Some(HEADER_LEN + i * 8);
        }
    }
    if h != sum {
        return bad(Problem::Checksum);
    }
    if let Some(at) = differs {
        return bad(Problem::Content { at });
    }
    if found != offset {
        return bad(Problem::Misplaced { found });
    }
    match expected {
        Some(expected) if expected != generation => bad(Problem::Stale { found: generation, expected }),
        _ => Ok(generation),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 4096;

    fn block(offset: u64, generation: u64) -> Vec<u8> {
        let mut b = vec![0u8; BS];
        fill(&mut b, offset, generation);
        b
    }

    fn problem(b: &[u8], offset: u64, expected: Option<u64>) -> Problem {
        check(b, offset, expected).expect_err("a mismatch").problem
    }

    #[test]
    fn round_trips() {
        for (offset, generation) in [(0, 0), (4096, 1), (1 << 40, u64::MAX)] {
            assert_eq!(check(&block(offset, generation), offset, Some(generation)), Ok(generation));
            assert_eq!(check(&block(offset, generation), offset, None), Ok(generation));
        }
        let mut two = vec![0u8; 2 * BS];
        fill_blocks(&mut two, 8192, 3, BS);
        assert_eq!(check(&two[BS..], 8192 + BS as u64, Some(3)), Ok(3));
        assert_ne!(block(0, 1), block(4096, 1));
        assert_ne!(block(0, 1), block(0, 2));
    }

    #[test]
    fn names_each_problem() {
        assert_eq!(problem(&[0u8; BS], 0, None), Problem::Zeros);
        assert_eq!(problem(&[0xAB; BS], 0, None), Problem::Foreign);
        let mut torn = block(4096, 1);
        torn[2048..].copy_from_slice(&block(4096, 2)[2048..]);
        assert_eq!(problem(&torn, 4096, Some(1)), Problem::Checksum);
        let mut flipped = block(4096, 1);
        flipped[100] ^= 1;
        assert_eq!(problem(&flipped, 4096, None), Problem::Checksum);
        let mut forged = block(4096, 1);
        forged[64] ^= 1;
        let h = forged[..24].chunks_exact(8).chain(forged[32..].chunks_exact(8)).fold(SEED, |h, w| mix(h, word(w)));
        forged[24..32].copy_from_slice(&h.to_le_bytes());
        assert_eq!(problem(&forged, 4096, None), Problem::Content { at: 64 });
        assert_eq!(problem(&block(8192, 1), 4096, Some(1)), Problem::Misplaced { found: 8192 });
        assert_eq!(problem(&block(4096, 1), 4096, Some(2)), Problem::Stale { found: 1, expected: 2 });
        let m = check(&block(4096, 1), 4096, Some(2)).unwrap_err();
        assert_eq!(
            m.to_string(),
            "block at offset 4096 (0x1000): holds generation 1, expected 2 (lost or stale write)"
        );
    }
}
