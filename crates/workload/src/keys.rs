use alloy_consensus::{SignableTransaction, TxEip1559, TxEnvelope};
use alloy_primitives::{Address, B256, Signature, U256, keccak256};
use rayon::prelude::*;
use secp256k1::{Message, PublicKey, SECP256K1, SecretKey};

/// The private key of workload account `index` under `seed`: `base(seed) + index`, where
/// `base` is keccak of a label and the seed.
///
/// Consecutive keys let `derive_signers` get each public key from the previous one with one point
/// addition instead of a full scalar multiplication (several times cheaper; deriving the public
/// keys is most of the generation time for a million accounts). `base` is re-hashed until its top
/// byte is below 0xff, so `base + index` stays far below the curve order for any `u64` index: every
/// key is valid and no two accounts share one.
pub fn private_key(seed: u64, index: u64) -> B256 {
    B256::from(key_base(seed) + U256::from(index))
}

fn key_base(seed: u64) -> U256 {
    let mut preimage = [0u8; 26];
    preimage[..18].copy_from_slice(b"overdrive-workload");
    preimage[18..].copy_from_slice(&seed.to_be_bytes());
    let mut base = keccak256(preimage);
    while base[0] == 0xff || base.is_zero() {
        base = keccak256(base);
    }
    U256::from_be_bytes(base.0)
}

/// The key of the account that deploys the contracts. It does not depend on the seed, so
/// contract addresses are the same for every seed of a kind.
pub fn deployer_key() -> B256 {
    valid_key(keccak256(b"overdrive-workload deployer"))
}

fn valid_key(key: B256) -> B256 {
    B256::from(secret_key(key).secret_bytes())
}

/// The first of `key`, keccak(key), keccak(keccak(key)), ... that is a valid secret key (the
/// first one fails with probability ~2^-128).
fn secret_key(mut key: B256) -> SecretKey {
    loop {
        match SecretKey::from_byte_array(&key.0) {
            Ok(secret) => return secret,
            Err(_) => key = keccak256(key),
        }
    }
}

/// A private key with its address.
#[derive(Clone)]
pub(crate) struct Signer {
    pub(crate) secret: SecretKey,
    pub(crate) address: Address,
}

impl Signer {
    pub(crate) fn new(key: B256) -> Self {
        let secret = secret_key(key);
        let address = address_of(&PublicKey::from_secret_key(SECP256K1, &secret));
        Self { secret, address }
    }

    /// Signs an EIP-1559 transaction (RFC 6979 nonces, so the signature is deterministic;
    /// libsecp256k1 always returns low-s).
    pub(crate) fn sign(&self, tx: TxEip1559) -> TxEnvelope {
        let hash = tx.signature_hash();
        let sig = SECP256K1.sign_ecdsa_recoverable(&Message::from_digest(hash.0), &self.secret);
        let (recid, bytes) = sig.serialize_compact();
        let r = U256::from_be_slice(&bytes[..32]);
        let s = U256::from_be_slice(&bytes[32..]);
        let y_parity = i32::from(recid) == 1;
        TxEnvelope::Eip1559(tx.into_signed(Signature::new(r, s, y_parity)))
    }
}

/// Accounts per parallel task of [`derive_signers`]; each task pays one scalar
/// multiplication, then one point addition per account.
const DERIVE_CHUNK: usize = 1024;

/// Keys and addresses of accounts `0..count` under `seed`, in parallel chunks: the elliptic
/// curve work dominates generation time for large account sets.
pub(crate) fn derive_signers(seed: u64, count: usize) -> Vec<Signer> {
    let base = key_base(seed);
    let generator = PublicKey::from_secret_key(SECP256K1, &secret_key(B256::with_last_byte(1)));
    let chunks: Vec<Vec<Signer>> = (0..count.div_ceil(DERIVE_CHUNK))
        .into_par_iter()
        .map(|chunk| {
            let start = chunk * DERIVE_CHUNK;
            let end = (start + DERIVE_CHUNK).min(count);
            let mut previous: Option<PublicKey> = None;
            (start..end)
                .map(|i| {
                    let secret = secret_key(B256::from(base + U256::from(i)));
                    // key(i) = key(i - 1) + 1, so pub(i) = pub(i - 1) + G. The sum is never the
                    // point at infinity (keys stay below the order); the fallback keeps the
                    // function total anyway.
                    let public = previous
                        .and_then(|p| p.combine(&generator).ok())
                        .unwrap_or_else(|| PublicKey::from_secret_key(SECP256K1, &secret));
                    previous = Some(public);
                    Signer {
                        secret,
                        address: address_of(&public),
                    }
                })
                .collect()
        })
        .collect();
    chunks.concat()
}

fn address_of(public: &PublicKey) -> Address {
    Address::from_raw_public_key(&public.serialize_uncompressed()[1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_derivation_matches_each_key() {
        let count = 2 * DERIVE_CHUNK + 7;
        let signers = derive_signers(42, count);
        assert_eq!(signers.len(), count);
        for (i, signer) in signers.iter().enumerate() {
            let direct = Signer::new(private_key(42, i as u64));
            assert_eq!(signer.address, direct.address, "account {i}");
            assert_eq!(signer.secret, direct.secret, "account {i}");
        }
        assert_ne!(private_key(42, 0), private_key(43, 0));
    }
}
