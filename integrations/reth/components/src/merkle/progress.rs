//! What a chunked run of the stage has committed, so a restart goes on from there.
//!
//! Kept under a key of its own, not reth's `MerkleExecute` progress: reth decodes that one as
//! its own `MerkleCheckpoint`, and each stage must be able to tell the other's run apart.

use alloy_primitives::{B256, BlockNumber};
use reth_stages_api::{StageError, StageId};
use reth_storage_api::{StageCheckpointReader, StageCheckpointWriter};

/// The progress key.
pub const PROGRESS_ID: StageId = StageId::Other("OverdriveMerkleExecute");

const VERSION: u8 = 1;
const LEN: usize = 1 + 8 + 1 + 32;

/// A run over `..=target` that has written the storage tries of every changed account before
/// `next_account` (hashed address order), or all of them, and nothing of the account trie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The block the run computes the root of.
    pub target: BlockNumber,
    /// Whether the run cleared the trie tables and rebuilds them from the hashed state.
    pub rebuild: bool,
    /// Whether every changed storage trie is written: the account trie is next.
    pub storage_done: bool,
    /// The first changed account whose storage trie is not written yet (when not
    /// `storage_done`).
    pub next_account: B256,
}

impl Progress {
    /// The bytes stored: a version, the target, the flags (rebuild, storage done) and the next
    /// account.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(LEN);
        out.push(VERSION);
        out.extend_from_slice(&self.target.to_be_bytes());
        out.push(u8::from(self.rebuild) | (u8::from(self.storage_done) << 1));
        out.extend_from_slice(self.next_account.as_slice());
        out
    }

    /// Reads back what [`Progress::encode`] wrote; `None` for anything else, which the stage
    /// treats as no progress (it then starts the run over, which is always correct).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != LEN || bytes[0] != VERSION || bytes[9] > 3 {
            return None;
        }
        Some(Self {
            target: BlockNumber::from_be_bytes(bytes[1..9].try_into().ok()?),
            rebuild: bytes[9] & 1 == 1,
            storage_done: bytes[9] & 2 == 2,
            next_account: B256::from_slice(&bytes[10..]),
        })
    }

    /// The saved progress, if any.
    pub fn load(provider: &impl StageCheckpointReader) -> Result<Option<Self>, StageError> {
        let bytes = provider.get_stage_checkpoint_progress(PROGRESS_ID)?;
        Ok(bytes.as_deref().and_then(Self::decode))
    }

    /// Saves `progress`, or clears it with `None`.
    pub fn save(
        provider: &impl StageCheckpointWriter,
        progress: Option<Self>,
    ) -> Result<(), StageError> {
        let bytes = progress.map(|p| p.encode()).unwrap_or_default();
        Ok(provider.save_stage_checkpoint_progress(PROGRESS_ID, bytes)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_round_trips_and_junk_is_none() {
        for (target, rebuild, storage_done, byte) in [
            (0, false, false, 0u8),
            (1, true, false, 0xff),
            (u64::MAX, false, true, 7),
            (9, true, true, 1),
        ] {
            let next_account = B256::repeat_byte(byte);
            let progress = Progress {
                target,
                rebuild,
                storage_done,
                next_account,
            };
            assert_eq!(Progress::decode(&progress.encode()), Some(progress));
        }
        let good = Progress {
            target: 5,
            rebuild: true,
            storage_done: false,
            next_account: B256::ZERO,
        }
        .encode();
        assert_eq!(Progress::decode(&[]), None);
        assert_eq!(Progress::decode(&good[..LEN - 1]), None);
        let mut bad_version = good.clone();
        bad_version[0] = 2;
        assert_eq!(Progress::decode(&bad_version), None);
        let mut bad_mode = good;
        bad_mode[9] = 4;
        assert_eq!(Progress::decode(&bad_mode), None);
    }
}
