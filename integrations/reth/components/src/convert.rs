//! reth's types into overdrive's and back. The core crates and reth v2.5.1 share alloy and revm
//! (same versions, see the lock files), so most of this is choosing the other envelope.

use alloy_consensus::{Header, TxEnvelope, transaction::Recovered};
use alloy_evm::{EvmEnv, eth::EthBlockExecutionCtx};
use alloy_hardforks::{EthereumHardfork, EthereumHardforks, ForkCondition};
use overdrive_primitives::BlockWithSenders;
use reth_chainspec::{ChainSpec, EthChainSpec};
use reth_ethereum_primitives::{Receipt, TransactionSigned};

/// overdrive's chain spec for reth's: the chain id, every Ethereum fork's activation, the
/// deposit contract and the blob parameters. Execution reads nothing else (the genesis is left
/// empty).
pub fn chain_spec(spec: &ChainSpec) -> overdrive_primitives::ChainParams {
    overdrive_primitives::ChainParams {
        chain_id: spec.chain().id(),
        hardforks: EthereumHardfork::VARIANTS
            .iter()
            .map(|&fork| (fork, spec.ethereum_fork_activation(fork)))
            .filter(|(_, condition)| *condition != ForkCondition::Never)
            .collect(),
        deposit_contract_address: spec.deposit_contract().map(|contract| contract.address),
        blob_params: spec.blob_params.clone(),
        genesis: Default::default(),
        expected_genesis_hash: None,
    }
}

/// The block an executor is building from its environment and context: the header fields
/// execution reads (the EVM environment's and the system calls' inputs), the transactions
/// converted to alloy's envelope. Fields execution never reads (roots, gas used) are zero; the
/// executor's path choice reads the transactions' gas limits instead.
pub fn block(
    env: &EvmEnv,
    ctx: &EthBlockExecutionCtx<'_>,
    transactions: Vec<Recovered<TxEnvelope>>,
) -> BlockWithSenders {
    let block_env = &env.block_env;
    let header = Header {
        parent_hash: ctx.parent_hash,
        beneficiary: block_env.beneficiary,
        number: block_env.number.saturating_to(),
        timestamp: block_env.timestamp.saturating_to(),
        gas_limit: block_env.gas_limit,
        base_fee_per_gas: Some(block_env.basefee),
        difficulty: block_env.difficulty,
        mix_hash: block_env.prevrandao.unwrap_or_default(),
        excess_blob_gas: block_env
            .blob_excess_gas_and_price
            .as_ref()
            .map(|blob| blob.excess_blob_gas),
        parent_beacon_block_root: ctx.parent_beacon_block_root,
        extra_data: ctx.extra_data.clone(),
        ..Default::default()
    };
    BlockWithSenders::from_parts(
        header,
        transactions,
        ctx.ommers.to_vec(),
        ctx.withdrawals.as_ref().map(|w| w.to_vec()),
    )
}

/// A transaction in alloy's envelope (reth's has no blob sidecar variant).
pub fn transaction(
    tx: &TransactionSigned,
    signer: alloy_primitives::Address,
) -> Recovered<TxEnvelope> {
    Recovered::new_unchecked(TxEnvelope::from(tx.clone()), signer)
}

/// overdrive's receipts as reth's.
pub fn receipts(receipts: Vec<alloy_consensus::ReceiptEnvelope>) -> Vec<Receipt> {
    receipts.into_iter().map(Receipt::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reth_chainspec::{DEV, MAINNET};

    /// Every fork of reth's schedule keeps its activation and blob parameters, so the executor
    /// derives the same EVM environment from both specs.
    #[test]
    fn chain_specs_agree_on_every_fork() {
        for spec in [&*MAINNET, &*DEV] {
            let ours = chain_spec(spec);
            assert_eq!(ours.chain_id, spec.chain().id());
            for &fork in EthereumHardfork::VARIANTS {
                assert_eq!(
                    ours.ethereum_fork_activation(fork),
                    spec.ethereum_fork_activation(fork),
                    "{fork:?}"
                );
                if let ForkCondition::Timestamp(time) = spec.ethereum_fork_activation(fork) {
                    assert_eq!(
                        ours.blob_params_at(time),
                        spec.blob_params_at_timestamp(time),
                        "{fork:?}"
                    );
                }
            }
            assert_eq!(
                ours.deposit_contract_address,
                spec.deposit_contract().map(|c| c.address)
            );
        }
    }
}
