//! Verifiable I/O through the initiator library: every block's content follows from a seed and
//! its offset, so any process can check any region it knows the seed of.

use std::time::{Duration, Instant};

use rblk_initiator::{Done, Queue, Volume};

/// Block size the patterns are laid out in.
pub const BLOCK: usize = 4096;
/// Bytes per queued I/O.
pub const IO: usize = 16 * 1024;

/// A byte range of a volume and the seed of its pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte (block aligned).
    pub offset: u64,
    /// Bytes (a multiple of [`IO`]).
    pub len: u64,
    /// Pattern seed.
    pub seed: u64,
}

impl std::str::FromStr for Region {
    type Err = String;
    /// `OFFSET:LEN:SEED`.
    fn from_str(s: &str) -> Result<Self, String> {
        let p: Vec<u64> = s
            .split(':')
            .map(|x| x.parse().map_err(|_| format!("{s:?}: expected OFFSET:LEN:SEED")))
            .collect::<Result<_, _>>()?;
        match p[..] {
            [offset, len, seed] => Ok(Region { offset, len, seed }),
            _ => Err(format!("{s:?}: expected OFFSET:LEN:SEED")),
        }
    }
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.offset, self.len, self.seed)
    }
}

/// The content of the block at volume offset `offset` under `seed` (any length, from the
/// block's start).
pub fn pattern(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut x = (seed ^ offset.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x = xorshift(x);
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// The next value of Marsaglia's xorshift64 (13, 7, 17) after `x` (never 0 from a non-zero `x`):
/// the tests' cheap pseudo-random sequence, for block patterns and random offsets.
pub fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

fn fill(seed: u64, offset: u64, buf: &mut [u8]) {
    for (i, block) in buf.chunks_mut(BLOCK).enumerate() {
        pattern(seed, offset + (i * BLOCK) as u64, block);
    }
}

/// Writes (`verify == false`) or reads and checks (`verify == true`) `region` through `queues`,
/// each owned by its own thread and working on its share of the region at full depth.
pub fn run(queues: Vec<Queue>, region: Region, verify: bool) -> Result<(), String> {
    let n = queues.len() as u64;
    let ios = region.len / IO as u64;
    std::thread::scope(|s| {
        let handles: Vec<_> = queues
            .into_iter()
            .enumerate()
            .map(|(i, q)| {
                let (first, last) = (ios * i as u64 / n, ios * (i as u64 + 1) / n);
                let part =
                    Region { offset: region.offset + first * IO as u64, len: (last - first) * IO as u64, ..region };
                s.spawn(move || run_queue(q, part, verify))
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
    })
}

fn run_queue(mut q: Queue, region: Region, verify: bool) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut done: Vec<Done> = std::iter::repeat_with(Done::default).take(q.depth() as usize).collect();
    let (mut next, end) = (region.offset, region.offset + region.len);
    let mut buf = vec![0u8; IO];
    let mut got = vec![0u8; IO];
    let mut outstanding = 0u32;
    while next < end || outstanding > 0 {
        while next < end && outstanding < q.depth() {
            if verify {
                q.submit_read(next, IO as u32, next).map_err(|e| format!("read at {next}: {e}"))?;
            } else {
                fill(region.seed, next, &mut buf);
                q.submit_write(next, &buf, next).map_err(|e| format!("write at {next}: {e}"))?;
            }
            next += IO as u64;
            outstanding += 1;
        }
        let k = q.wait(&mut done, deadline).map_err(|e| format!("waiting for completions: {e}"))?;
        for d in &mut done[..k] {
            outstanding -= 1;
            d.result.as_ref().map_err(|e| format!("I/O at {}: {e}", d.offset))?;
            if verify {
                d.read_data(&mut got).map_err(|e| e.to_string())?;
                fill(region.seed, d.offset, &mut buf);
                if let Some(i) = got.iter().zip(&buf).position(|(a, b)| a != b) {
                    return Err(format!("mismatch at volume offset {} (seed {})", d.offset + i as u64, region.seed));
                }
            }
            d.release();
        }
    }
    Ok(())
}

/// Opens `count` queues of `depth` on `vol`.
pub fn queues(vol: &Volume, count: usize, depth: u32) -> Vec<Queue> {
    (0..count).map(|i| vol.queue_with(depth, IO).unwrap_or_else(|e| panic!("queue {i}: {e}"))).collect()
}

/// One of two writers of disjoint regions: writes `mine` with 4 queues at depth 16, marks it done
/// in `barrier`, waits for the other writer's mark, then verifies both regions.
pub fn pair(vol: &Volume, mine: Region, other: Region, barrier: &std::path::Path) -> Result<(), String> {
    run(queues(vol, 4, 16), mine, false)?;
    std::fs::write(barrier.join(mine.seed.to_string()), "written").map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while !barrier.join(other.seed.to_string()).exists() {
        if Instant::now() > deadline {
            return Err("the other writer never finished".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    run(queues(vol, 4, 16), mine, true)?;
    run(queues(vol, 4, 16), other, true)
}
