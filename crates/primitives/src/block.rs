use alloy_consensus::{
    Block, BlockBody, Header, TxEip4844Variant, TxEnvelope, transaction::Recovered,
};
use alloy_eips::eip4895::Withdrawal;
use alloy_primitives::{Address, B256};
use alloy_rlp::Decodable;

/// Why a block could not be turned into a [`BlockWithSenders`].
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The RLP did not decode as a block (or had trailing bytes).
    #[error("block RLP does not decode: {0}")]
    Rlp(#[from] alloy_rlp::Error),
    /// A blob transaction carries its blobs: that form is valid on the network (EIP-4844's
    /// `PooledTransactions`), never inside a block.
    #[error(
        "transaction {index} is a blob transaction with its blob sidecar, a form valid only on the network"
    )]
    BlobSidecarInBlock {
        /// Position of the transaction in the block.
        index: usize,
    },
    /// A transaction's signature did not recover to a sender.
    #[error("transaction {index} has an invalid signature: {reason}")]
    InvalidSignature {
        /// Position of the transaction in the block.
        index: usize,
        /// What the recovery said.
        reason: String,
    },
}

/// A block with recovered senders. Executors take this; recovery happens once, up front (and
/// can be done in parallel by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockWithSenders {
    /// The block header.
    pub header: Header,
    /// Transactions in block order, each with its sender.
    pub transactions: Vec<Recovered<TxEnvelope>>,
    /// Ommer headers (always empty after the merge, kept so validation can reject them).
    pub ommers: Vec<Header>,
    /// EIP-4895 withdrawals; `None` before Shanghai.
    pub withdrawals: Option<Vec<Withdrawal>>,
    /// The header hash, computed once.
    pub hash: B256,
}

impl BlockWithSenders {
    /// Builds a block from parts, recovering senders. Signatures must be canonical (low `s`).
    pub fn recover(block: Block<TxEnvelope>) -> Result<Self, BlockError> {
        let Block {
            header,
            body:
                BlockBody {
                    transactions,
                    ommers,
                    withdrawals,
                },
        } = block;
        let transactions = transactions
            .into_iter()
            .enumerate()
            .map(|(index, tx)| {
                if let TxEnvelope::Eip4844(signed) = &tx
                    && matches!(signed.tx(), TxEip4844Variant::TxEip4844WithSidecar(_))
                {
                    return Err(BlockError::BlobSidecarInBlock { index });
                }
                let sender = recover_sender(&tx)
                    .map_err(|reason| BlockError::InvalidSignature { index, reason })?;
                Ok(Recovered::new_unchecked(tx, sender))
            })
            .collect::<Result<Vec<_>, BlockError>>()?;
        Ok(Self::from_parts(
            header,
            transactions,
            ommers,
            withdrawals.map(|w| w.into_inner()),
        ))
    }

    /// Builds a block from already recovered transactions (e.g. the workload generators, which
    /// know the signer of every transaction they sign).
    pub fn from_parts(
        header: Header,
        transactions: Vec<Recovered<TxEnvelope>>,
        ommers: Vec<Header>,
        withdrawals: Option<Vec<Withdrawal>>,
    ) -> Self {
        let hash = header.hash_slow();
        Self {
            header,
            transactions,
            ommers,
            withdrawals,
            hash,
        }
    }

    /// Decodes a full block from RLP (no trailing bytes allowed) and recovers its senders.
    pub fn decode(mut rlp: &[u8]) -> Result<Self, BlockError> {
        let block = Block::<TxEnvelope>::decode(&mut rlp)?;
        if !rlp.is_empty() {
            return Err(BlockError::Rlp(alloy_rlp::Error::UnexpectedLength));
        }
        Self::recover(block)
    }

    /// The block's number.
    pub fn number(&self) -> u64 {
        self.header.number
    }

    /// Senders in block order.
    pub fn senders(&self) -> impl Iterator<Item = Address> + '_ {
        self.transactions.iter().map(|tx| tx.signer())
    }

    /// Back to a plain consensus block (for hashing roots, re-encoding, RPC).
    pub fn to_block(&self) -> Block<TxEnvelope> {
        Block {
            header: self.header.clone(),
            body: BlockBody {
                transactions: self
                    .transactions
                    .iter()
                    .map(|tx| tx.inner().clone())
                    .collect(),
                ommers: self.ommers.clone(),
                withdrawals: self.withdrawals.clone().map(Into::into),
            },
        }
    }
}

fn recover_sender(tx: &TxEnvelope) -> Result<Address, String> {
    use alloy_consensus::transaction::SignerRecoverable;
    tx.recover_signer().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_consensus::{
        SignableTransaction, TxEip4844, TxEip4844WithSidecar, transaction::SignerRecoverable,
    };
    use alloy_eips::{eip4844::BlobTransactionSidecar, eip7594::BlobTransactionSidecarVariant};
    use alloy_primitives::Signature;

    fn block_with(tx: TxEip4844Variant) -> Vec<u8> {
        let tx = TxEnvelope::from(tx.into_signed(Signature::test_signature()));
        let block = Block {
            header: Header::default(),
            body: BlockBody {
                transactions: vec![tx],
                ommers: Vec::new(),
                withdrawals: None,
            },
        };
        alloy_rlp::encode(block)
    }

    /// A blob transaction decodes in a block without its blobs, and is refused with them (its
    /// network form), whatever its signature.
    #[test]
    fn blob_sidecars_are_refused_inside_blocks() {
        let tx = TxEip4844 {
            blob_versioned_hashes: vec![B256::with_last_byte(1)],
            ..Default::default()
        };
        let bare = BlockWithSenders::decode(&block_with(TxEip4844Variant::TxEip4844(tx.clone())));
        assert!(
            !matches!(bare, Err(BlockError::BlobSidecarInBlock { .. })),
            "{bare:?}"
        );
        let full = TxEip4844Variant::TxEip4844WithSidecar(TxEip4844WithSidecar {
            tx,
            sidecar: BlobTransactionSidecarVariant::Eip4844(BlobTransactionSidecar::default()),
        });
        let signed = full.clone().into_signed(Signature::test_signature());
        assert!(TxEnvelope::from(signed).recover_signer().is_ok());
        assert!(matches!(
            BlockWithSenders::decode(&block_with(full)),
            Err(BlockError::BlobSidecarInBlock { index: 0 })
        ));
    }
}
