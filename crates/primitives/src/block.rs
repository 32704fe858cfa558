use alloy_consensus::{Block, BlockBody, Header, TxEnvelope, transaction::Recovered};
use alloy_eips::eip4895::Withdrawal;
use alloy_primitives::{Address, B256};
use alloy_rlp::Decodable;

/// Why a block could not be turned into a [`RecoveredBlock`].
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The RLP did not decode as a block (or had trailing bytes).
    #[error("block RLP does not decode: {0}")]
    Rlp(#[from] alloy_rlp::Error),
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
pub struct RecoveredBlock {
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

impl RecoveredBlock {
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
