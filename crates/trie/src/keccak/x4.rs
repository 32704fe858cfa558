//! Keccak-256 of four inputs at once with AVX2: four Keccak-f[1600] states side by side, one
//! per 64-bit lane of a 256-bit register, so every step of the permutation is one vector
//! instruction for all four (the layout of XKCP's `KeccakP1600times4`).
//!
//! No crates.io crate offers this for Keccak-256 on stable Rust: RustCrypto's `keccak` needs
//! nightly `portable_simd` for its parallel backends, libcrux-sha3's four-way API pads for
//! SHA-3 and SHAKE only (not Keccak-256's `0x01`), and `asmcrypto` has eight lanes for
//! AVX-512 only. `tests::x4_equals_scalar` checks it against alloy's `keccak256` at every
//! length up to five blocks, in every lane.

use alloy_primitives::B256;
use core::arch::x86_64::{
    __m256i, _mm256_andnot_si256, _mm256_or_si256, _mm256_set_epi64x, _mm256_set1_epi64x,
    _mm256_setzero_si256, _mm256_slli_epi64, _mm256_srli_epi64, _mm256_storeu_si256,
    _mm256_xor_si256,
};

use super::RATE;

/// 64-bit words absorbed per permutation.
const RATE_WORDS: usize = RATE / 8;

/// The round constants of the iota step.
const RC: [u64; 24] = [
    0x0000000000000001,
    0x0000000000008082,
    0x800000000000808A,
    0x8000000080008000,
    0x000000000000808B,
    0x0000000080000001,
    0x8000000080008081,
    0x8000000000008009,
    0x000000000000008A,
    0x0000000000000088,
    0x0000000080008009,
    0x000000008000000A,
    0x000000008000808B,
    0x800000000000008B,
    0x8000000000008089,
    0x8000000000008003,
    0x8000000000008002,
    0x8000000000000080,
    0x000000000000800A,
    0x800000008000000A,
    0x8000000080008081,
    0x8000000000008080,
    0x0000000080000001,
    0x8000000080008008,
];

/// Permutations an input of `len` bytes takes: padding adds one byte at least.
pub(super) fn blocks(len: usize) -> usize {
    len / RATE + 1
}

/// Whether this CPU can run [`keccak256_x4`].
pub(super) fn supported() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// The Keccak-256 of four inputs that take the same number of permutations ([`blocks`]).
///
/// # Panics
/// If the inputs' block counts differ, or the CPU lacks AVX2.
pub(super) fn keccak256_x4(inputs: [&[u8]; 4]) -> [B256; 4] {
    let n = blocks(inputs[0].len());
    assert!(inputs.iter().all(|input| blocks(input.len()) == n));
    // The standard library caches the detection: an atomic load per call, negligible beside the
    // hashing.
    assert!(supported(), "the four-way Keccak needs AVX2");
    // SAFETY: the CPU has AVX2, checked just above.
    unsafe { sponge(inputs, n) }
}

/// Absorbs `n` blocks of each input (the last one padded, `0x01 … 0x80`), then squeezes 32
/// bytes per lane.
#[target_feature(enable = "avx2")]
fn sponge(inputs: [&[u8]; 4], n: usize) -> [B256; 4] {
    let mut state = [_mm256_setzero_si256(); 25];
    let mut words = [[0u64; RATE_WORDS]; 4];
    for block in 0..n {
        for (lane, input) in inputs.iter().enumerate() {
            let from = block * RATE;
            if block + 1 < n {
                let bytes = &input[from..from + RATE];
                for (word, chunk) in words[lane].iter_mut().zip(bytes.chunks_exact(8)) {
                    *word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
                }
            } else {
                let rest = &input[from..];
                let mut last = [0u8; RATE];
                last[..rest.len()].copy_from_slice(rest);
                last[rest.len()] ^= 0x01;
                last[RATE - 1] ^= 0x80;
                for (word, chunk) in words[lane].iter_mut().zip(last.chunks_exact(8)) {
                    *word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
                }
            }
        }
        for (i, lane) in state.iter_mut().enumerate().take(RATE_WORDS) {
            let block = _mm256_set_epi64x(
                words[3][i] as i64,
                words[2][i] as i64,
                words[1][i] as i64,
                words[0][i] as i64,
            );
            *lane = _mm256_xor_si256(*lane, block);
        }
        permute(&mut state);
    }
    let mut out = [[0u64; 4]; 4];
    for (word, lanes) in state.iter().zip(out.iter_mut()) {
        // SAFETY: `lanes` is 32 writable bytes; the store has no alignment requirement.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), *word) };
    }
    std::array::from_fn(|lane| {
        let mut hash = B256::ZERO;
        for (word, bytes) in out.iter().zip(hash.0.chunks_exact_mut(8)) {
            bytes.copy_from_slice(&word[lane].to_le_bytes());
        }
        hash
    })
}

/// `v` rotated left by `n` bits in each lane (AVX2 has no 64-bit rotate).
macro_rules! rotl {
    ($v:expr, 0) => {
        $v
    };
    ($v:expr, $n:literal) => {{
        let v = $v;
        _mm256_or_si256(
            _mm256_slli_epi64::<$n>(v),
            _mm256_srli_epi64::<{ 64 - $n }>(v),
        )
    }};
}

/// rho and pi: `b[dst] = a[src]` rotated by the lane's offset, for the 25 (dst, src, offset)
/// of Keccak (`a[x + 5y]` goes to `b[y + 5((2x + 3y) mod 5)]`).
macro_rules! rho_pi {
    ($a:ident, $b:ident; $(($dst:literal, $src:literal, $rot:tt)),* $(,)?) => {
        $( $b[$dst] = rotl!($a[$src], $rot); )*
    };
}

/// Keccak-f[1600] on four states at once: `state[i]` holds word `i` of each lane's state.
#[target_feature(enable = "avx2")]
fn permute(a: &mut [__m256i; 25]) {
    let mut b = [_mm256_setzero_si256(); 25];
    let mut c = [_mm256_setzero_si256(); 5];
    for rc in RC {
        // theta
        for x in 0..5 {
            c[x] = _mm256_xor_si256(
                _mm256_xor_si256(_mm256_xor_si256(a[x], a[x + 5]), a[x + 10]),
                _mm256_xor_si256(a[x + 15], a[x + 20]),
            );
        }
        for x in 0..5 {
            let d = _mm256_xor_si256(c[(x + 4) % 5], rotl!(c[(x + 1) % 5], 1));
            for y in 0..5 {
                a[x + 5 * y] = _mm256_xor_si256(a[x + 5 * y], d);
            }
        }
        rho_pi!(a, b;
            (0, 0, 0), (1, 6, 44), (2, 12, 43), (3, 18, 21), (4, 24, 14),
            (5, 3, 28), (6, 9, 20), (7, 10, 3), (8, 16, 45), (9, 22, 61),
            (10, 1, 1), (11, 7, 6), (12, 13, 25), (13, 19, 8), (14, 20, 18),
            (15, 4, 27), (16, 5, 36), (17, 11, 10), (18, 17, 15), (19, 23, 56),
            (20, 2, 62), (21, 8, 55), (22, 14, 39), (23, 15, 41), (24, 21, 2),
        );
        // chi: a = b ^ (!b[x+1] & b[x+2]) along each row
        for y in 0..5 {
            for x in 0..5 {
                a[x + 5 * y] = _mm256_xor_si256(
                    b[x + 5 * y],
                    _mm256_andnot_si256(b[(x + 1) % 5 + 5 * y], b[(x + 2) % 5 + 5 * y]),
                );
            }
        }
        // iota
        a[0] = _mm256_xor_si256(a[0], _mm256_set1_epi64x(rc as i64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::keccak256;

    #[test]
    fn x4_equals_scalar() {
        if !supported() {
            eprintln!("no AVX2 on this CPU: the four-way Keccak is never used here");
            return;
        }
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 151 + i / 5) as u8).collect();
        for len in 0..5 * RATE + 8 {
            // Four different inputs of one block count: the same length at different
            // offsets, and shorter ones where the block count allows.
            let n = blocks(len);
            let short = len.saturating_sub(len % RATE).max((n - 1) * RATE);
            let lens = [len, short, (len + short) / 2, len];
            let inputs: [&[u8]; 4] = std::array::from_fn(|lane| {
                let at = lane * 977;
                &data[at..at + lens[lane]]
            });
            let hashes = keccak256_x4(inputs);
            for (input, hash) in inputs.iter().zip(hashes) {
                assert_eq!(hash, keccak256(input), "length {}", input.len());
            }
        }
    }

    #[test]
    #[should_panic(expected = "blocks(input.len()) == n")]
    fn unequal_block_counts_are_refused() {
        keccak256_x4([&[0u8; 10], &[0u8; 10], &[0u8; 200], &[0u8; 10]]);
    }
}
