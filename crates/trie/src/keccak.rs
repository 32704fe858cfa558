//! Keccak-256 of many node encodings at once.
//!
//! Hashing is a large share of a block's state-root time, and a trie's changed nodes come in
//! large groups that do not depend on each other (all changed leaves; then the branches just
//! above them; ...). Two vector paths hash several of them per pass of the permutation, one
//! per 64-bit lane:
//! - AVX-512: `asmcrypto`, eight inputs. Eight branches cost about as much as one scalar call of
//!   alloy's `keccak256` (keccak-asm).
//! - AVX2 without AVX-512: the `x4` module, four inputs.
//!
//! Everything else — neither, a lone input — goes through `keccak256`.
//!
//! `asmcrypto` 0.1.2 is pinned and used only where it is correct and fast:
//! - it pads inputs of 135 mod 136 bytes wrongly (the padding index runs past the rate and
//!   panics), so those are hashed one by one here;
//! - eight inputs of different lengths fall back to its own slow scalar finish, so only inputs
//!   of equal length share a call;
//! - its fallback without AVX-512 is slow scalar code, so without AVX-512 it is never called.
//!
//! `tests::batched_equals_scalar_on_every_runnable_path` checks every length up to four blocks
//! against `keccak256` through every path this CPU can run (the AVX-512 one only where the CPU
//! has it), and `x4::tests` checks the four-way path itself.

use alloy_primitives::{B256, keccak256};
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod x4;

/// Keccak-256's rate: bytes absorbed per permutation.
const RATE: usize = 136;

/// How this CPU hashes a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// One input at a time.
    Scalar,
    /// Four inputs of one block count per pass (AVX2).
    X4,
    /// Eight inputs of one length per pass (AVX-512).
    X8,
}

fn path() -> Path {
    static PATH: OnceLock<Path> = OnceLock::new();
    *PATH.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
            {
                return Path::X8;
            }
            if x4::supported() {
                return Path::X4;
            }
        }
        Path::Scalar
    })
}

/// Whether inputs are hashed several at a time on this machine.
pub(crate) fn batched() -> bool {
    path() != Path::Scalar
}

/// Writes the Keccak-256 of `inputs[i]` to `out[i]` for every `i`. `order` is scratch space.
pub(crate) fn keccak256_many(inputs: &[&[u8]], out: &mut [B256], order: &mut Vec<u32>) {
    let path = if inputs.len() < 2 {
        Path::Scalar
    } else {
        path()
    };
    hash_on(path, inputs, out, order);
}

/// [`keccak256_many`] through `path`, which this CPU must support.
fn hash_on(path: Path, inputs: &[&[u8]], out: &mut [B256], order: &mut Vec<u32>) {
    debug_assert_eq!(inputs.len(), out.len());
    match path {
        Path::Scalar => {
            for (input, out) in inputs.iter().zip(out.iter_mut()) {
                *out = keccak256(input);
            }
        }
        #[cfg(target_arch = "x86_64")]
        Path::X4 => many_x4(inputs, out, order),
        #[cfg(target_arch = "x86_64")]
        Path::X8 => many_x8(inputs, out, order),
        #[cfg(not(target_arch = "x86_64"))]
        Path::X4 | Path::X8 => unreachable!("vector paths are chosen on x86_64 only"),
    }
}

/// Sorts `0..inputs.len()` into `order` by `key` and calls `run` on each run of equal keys.
fn runs_by(
    inputs: &[&[u8]],
    order: &mut Vec<u32>,
    key: impl Fn(&[u8]) -> usize,
    mut run: impl FnMut(&[u32]),
) {
    order.clear();
    order.extend(0..inputs.len() as u32);
    order.sort_unstable_by_key(|&i| key(inputs[i as usize]));
    let mut start = 0;
    while start < order.len() {
        let k = key(inputs[order[start] as usize]);
        let end = start
            + order[start..]
                .iter()
                .take_while(|&&i| key(inputs[i as usize]) == k)
                .count();
        run(&order[start..end]);
        start = end;
    }
}

/// Four per pass. Inputs of one block count share a pass whatever their lengths, each lane
/// padding its own.
#[cfg(target_arch = "x86_64")]
fn many_x4(inputs: &[&[u8]], out: &mut [B256], order: &mut Vec<u32>) {
    runs_by(
        inputs,
        order,
        |input| x4::blocks(input.len()),
        |run| {
            if run.len() < 2 {
                for &i in run {
                    out[i as usize] = keccak256(inputs[i as usize]);
                }
                return;
            }
            for chunk in run.chunks(4) {
                // A short last chunk repeats its first input in the spare lanes: a pass
                // costs the same whatever the lanes hold.
                let lanes: [&[u8]; 4] = std::array::from_fn(|lane| {
                    inputs[chunk.get(lane).copied().unwrap_or(chunk[0]) as usize]
                });
                for (&i, hash) in chunk.iter().zip(x4::keccak256_x4(lanes)) {
                    out[i as usize] = hash;
                }
            }
        },
    );
}

/// Eight per pass, through `asmcrypto`: equal lengths only, 135 mod 136 one by one.
#[cfg(target_arch = "x86_64")]
fn many_x8(inputs: &[&[u8]], out: &mut [B256], order: &mut Vec<u32>) {
    runs_by(
        inputs,
        order,
        |input| input.len(),
        |run| {
            let len = inputs[run[0] as usize].len();
            if run.len() < 2 || len % RATE == RATE - 1 {
                for &i in run {
                    out[i as usize] = keccak256(inputs[i as usize]);
                }
                return;
            }
            for chunk in run.chunks(8) {
                let lanes: [&[u8]; 8] = std::array::from_fn(|lane| {
                    inputs[chunk.get(lane).copied().unwrap_or(chunk[0]) as usize]
                });
                let hashes = asmcrypto::keccak256_batch(lanes);
                for (&i, hash) in chunk.iter().zip(hashes) {
                    out[i as usize] = B256::from(hash);
                }
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path this CPU can run, not only the one [`path`] picks: the AVX2 path is tested
    /// on AVX-512 machines too, and the scalar one everywhere.
    fn runnable_paths() -> Vec<Path> {
        let mut paths = vec![Path::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if x4::supported() {
                paths.push(Path::X4);
            }
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
            {
                paths.push(Path::X8);
            }
        }
        paths
    }

    #[test]
    fn batched_equals_scalar_on_every_runnable_path() {
        // Every length up to four blocks and a bit, in groups that mix equal and unequal
        // lengths (135 mod 136 included), with up to eleven inputs of one length.
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 131 + i / 7) as u8).collect();
        let mut order = Vec::new();
        let paths = runnable_paths();
        // The path the trie takes is among those tested.
        assert!(paths.contains(&path()), "{paths:?}");
        for &path in &paths {
            for len in 0..(4 * RATE + 16) {
                let mut inputs: Vec<&[u8]> = Vec::new();
                for copy in 0..(len % 12) {
                    inputs.push(&data[copy * 3..copy * 3 + len]);
                }
                inputs.push(&data[7..7 + (len * 7) % 600]);
                inputs.push(&data[1..1 + len / 2]);
                let mut out = vec![B256::ZERO; inputs.len()];
                hash_on(path, &inputs, &mut out, &mut order);
                for (input, hash) in inputs.iter().zip(&out) {
                    assert_eq!(*hash, keccak256(input), "{path:?}, length {}", input.len());
                }
            }
        }
    }

    #[test]
    fn no_input_and_one_input() {
        let mut order = Vec::new();
        keccak256_many(&[], &mut [], &mut order);
        let mut out = [B256::ZERO];
        keccak256_many(&[b"abc"], &mut out, &mut order);
        assert_eq!(out[0], keccak256(b"abc"));
    }
}
