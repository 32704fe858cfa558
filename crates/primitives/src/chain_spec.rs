use alloy_consensus::{
    EMPTY_OMMER_ROOT_HASH, Header, constants::EMPTY_WITHDRAWALS, proofs::calculate_transaction_root,
};
use alloy_eips::{
    eip1559::{BaseFeeParams, INITIAL_BASE_FEE},
    eip2935, eip4788,
    eip6110::MAINNET_DEPOSIT_CONTRACT_ADDRESS,
    eip7002, eip7251,
    eip7685::EMPTY_REQUESTS_HASH,
    eip7840::BlobParams,
    eip7892::BlobScheduleBlobParams,
};
use alloy_evm::eth::spec::EthExecutorSpec;
use alloy_genesis::{ChainConfig, Genesis, GenesisAccount};
use alloy_hardforks::{EthereumHardfork, EthereumHardforks, ForkCondition};
use alloy_primitives::{Address, B256, Bytes, U256, b256, bytes};
use alloy_trie::EMPTY_ROOT_HASH;
use std::path::Path;

/// Errors loading a chain specification.
#[derive(Debug, thiserror::Error)]
pub enum ChainParamsError {
    /// The genesis file could not be read.
    #[error("cannot read genesis file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The genesis file is not valid geth-style genesis JSON.
    #[error("invalid genesis JSON in {path}: {source}")]
    Json {
        /// The file.
        path: String,
        /// The cause.
        source: serde_json::Error,
    },
    /// A name that is neither a preset nor a file.
    #[error("unknown chain {0:?}: expected `mainnet`, `dev` or a path to a genesis.json")]
    Unknown(String),
    /// A preset whose genesis allocation is not shipped.
    #[error("{0}")]
    Unsupported(String),
    /// The genesis file parses but cannot describe a chain: alloy's `Genesis` defaults every
    /// missing field, so `{}` (or any other JSON object) would otherwise load as chain 1, with
    /// Frontier only and a zero gas limit.
    #[error("genesis file {path} is not usable: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The chain specification: chain id, fork schedule, genesis.
///
/// Forks activate by block number (Frontier through Paris) or by timestamp (Shanghai on). The
/// spec implements alloy's `EthereumHardforks` and `EthExecutorSpec`, so the reference
/// executor and every overdrive executor read the same schedule.
#[derive(Debug, Clone)]
pub struct ChainParams {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// Activation of each fork; forks not listed never activate.
    pub hardforks: Vec<(EthereumHardfork, ForkCondition)>,
    /// EIP-6110 deposit contract (Prague requests).
    pub deposit_contract_address: Option<Address>,
    /// EIP-4844/7840 blob parameters of each fork, and of the blob-parameter-only forks
    /// (EIP-7892) by activation time: reth's own type, read the way reth reads it.
    pub blob_params: BlobScheduleBlobParams,
    /// Genesis parameters and allocation.
    pub genesis: Genesis,
    /// Known genesis hash, when the preset is a public network (used as a check).
    pub expected_genesis_hash: Option<B256>,
}

/// The dev chain's pre-funded accounts are keyed by these private keys (keccak of a label), so
/// tests, the node and scripts can sign without any wallet tooling.
pub const DEV_ACCOUNT_COUNT: usize = 10;

impl ChainParams {
    /// Ethereum mainnet's fork schedule and genesis header parameters.
    ///
    /// The mainnet genesis allocation (8,893 accounts) is not shipped with overdrive; pass a
    /// mainnet `genesis.json` with `--chain FILE` to build mainnet's genesis state.
    pub fn mainnet() -> Self {
        let genesis = Genesis {
            nonce: 0x42,
            timestamp: 0,
            extra_data: bytes!("11bbe8db4e347b4e8c937c1c8370e4b5ed33adb3db69cbdb7a38e1e50b1b82fa"),
            gas_limit: 5000,
            difficulty: U256::from(17_179_869_184u64),
            config: ChainConfig {
                chain_id: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        let hardforks = EthereumHardfork::mainnet().to_vec();
        let scheduled = [EthereumHardfork::Bpo1, EthereumHardfork::Bpo2]
            .into_iter()
            .zip([BlobParams::bpo1(), BlobParams::bpo2()])
            .filter_map(|(fork, params)| {
                let (_, condition) = hardforks.iter().find(|(f, _)| *f == fork)?;
                match condition {
                    ForkCondition::Timestamp(time) => Some((*time, params)),
                    _ => None,
                }
            })
            .collect::<Vec<_>>();
        Self {
            chain_id: 1,
            hardforks,
            deposit_contract_address: Some(MAINNET_DEPOSIT_CONTRACT_ADDRESS),
            blob_params: BlobScheduleBlobParams::mainnet().with_scheduled(scheduled),
            genesis,
            expected_genesis_hash: Some(b256!(
                "d4e56740f876aef8c010b86a40d5f56745a118d0906a34e69aec8c0db1cb8fa3"
            )),
        }
    }

    /// Mainnet with its genesis allocation read from `path`, a JSON map of address to balance
    /// (what `scripts/setup-genesis.sh` exports from the `@ethereumjs/genesis` npm package).
    pub fn mainnet_with_alloc_file(path: &Path) -> Result<Self, ChainParamsError> {
        let display = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| ChainParamsError::Io {
            path: display.clone(),
            source,
        })?;
        let balances: std::collections::BTreeMap<Address, U256> = serde_json::from_slice(&bytes)
            .map_err(|source| ChainParamsError::Json {
                path: display,
                source,
            })?;
        let mut spec = Self::mainnet();
        spec.genesis.alloc = balances
            .into_iter()
            .map(|(a, balance)| {
                (
                    a,
                    GenesisAccount {
                        balance,
                        ..Default::default()
                    },
                )
            })
            .collect();
        Ok(spec)
    }

    /// A local development chain: every fork through Prague active at genesis, the system
    /// contracts of EIP-4788/2935/7002/7251 predeployed, and [`DEV_ACCOUNT_COUNT`] funded
    /// accounts whose keys are [`ChainParams::dev_private_key`].
    pub fn dev() -> Self {
        let mut alloc = std::collections::BTreeMap::new();
        let funds = U256::from(10u128.pow(24)); // one million ether each
        for i in 0..DEV_ACCOUNT_COUNT {
            let address = dev_address(i);
            alloc.insert(
                address,
                GenesisAccount {
                    balance: funds,
                    ..Default::default()
                },
            );
        }
        for (address, code) in system_contracts() {
            alloc.insert(
                address,
                GenesisAccount {
                    code: Some(code),
                    nonce: Some(1),
                    ..Default::default()
                },
            );
        }
        let config = ChainConfig {
            shanghai_time: Some(0),
            cancun_time: Some(0),
            prague_time: Some(0),
            deposit_contract_address: Some(Address::ZERO),
            ..merged_chain_config(1337)
        };
        let genesis = Genesis {
            config,
            gas_limit: 60_000_000,
            base_fee_per_gas: Some(INITIAL_BASE_FEE as u128),
            alloc,
            ..Default::default()
        };
        Self::from_genesis(genesis)
    }

    /// The private key of dev account `i` (see [`ChainParams::dev`]).
    pub fn dev_private_key(i: usize) -> B256 {
        alloy_primitives::keccak256(format!("overdrive dev account {i}"))
    }

    /// A spec from a geth-style genesis: forks from its `config`, chain id, allocation, and the
    /// blob schedule (`config.blobSchedule`, keyed `cancun`, `prague`, `osaka`, `bpo1`..`bpo5`;
    /// forks it leaves out keep Ethereum's parameters).
    pub fn from_genesis(genesis: Genesis) -> Self {
        let c = &genesis.config;
        let mut hardforks = vec![(EthereumHardfork::Frontier, ForkCondition::Block(0))];
        let blocks = [
            (EthereumHardfork::Homestead, c.homestead_block),
            (
                EthereumHardfork::Dao,
                c.dao_fork_block.filter(|_| c.dao_fork_support),
            ),
            (EthereumHardfork::Tangerine, c.eip150_block),
            (EthereumHardfork::SpuriousDragon, c.eip155_block),
            (EthereumHardfork::Byzantium, c.byzantium_block),
            (EthereumHardfork::Constantinople, c.constantinople_block),
            (EthereumHardfork::Petersburg, c.petersburg_block),
            (EthereumHardfork::Istanbul, c.istanbul_block),
            (EthereumHardfork::MuirGlacier, c.muir_glacier_block),
            (EthereumHardfork::Berlin, c.berlin_block),
            (EthereumHardfork::London, c.london_block),
            (EthereumHardfork::ArrowGlacier, c.arrow_glacier_block),
            (EthereumHardfork::GrayGlacier, c.gray_glacier_block),
        ];
        hardforks.extend(
            blocks
                .into_iter()
                .filter_map(|(f, b)| Some((f, ForkCondition::Block(b?)))),
        );
        // The merge: a netsplit block if given, block 0 for a chain that starts merged,
        // otherwise the TTD with no known activation block.
        let paris = match (c.merge_netsplit_block, c.terminal_total_difficulty) {
            (Some(block), _) => Some(ForkCondition::Block(block)),
            (None, Some(ttd)) if ttd.is_zero() || c.terminal_total_difficulty_passed => {
                Some(ForkCondition::Block(0))
            }
            (None, Some(ttd)) => Some(ForkCondition::TTD {
                activation_block_number: u64::MAX,
                fork_block: None,
                total_difficulty: ttd,
            }),
            (None, None) => None,
        };
        hardforks.extend(paris.map(|p| (EthereumHardfork::Paris, p)));
        let times = [
            (EthereumHardfork::Shanghai, c.shanghai_time),
            (EthereumHardfork::Cancun, c.cancun_time),
            (EthereumHardfork::Prague, c.prague_time),
            (EthereumHardfork::Osaka, c.osaka_time),
            (EthereumHardfork::Bpo1, c.bpo1_time),
            (EthereumHardfork::Bpo2, c.bpo2_time),
            (EthereumHardfork::Bpo3, c.bpo3_time),
            (EthereumHardfork::Bpo4, c.bpo4_time),
            (EthereumHardfork::Bpo5, c.bpo5_time),
            (EthereumHardfork::Amsterdam, c.amsterdam_time),
        ];
        hardforks.extend(
            times
                .into_iter()
                .filter_map(|(f, t)| Some((f, ForkCondition::Timestamp(t?)))),
        );
        Self {
            chain_id: c.chain_id,
            hardforks,
            deposit_contract_address: c.deposit_contract_address,
            blob_params: c.blob_schedule_blob_params(),
            genesis,
            expected_genesis_hash: None,
        }
    }

    /// Loads `mainnet`, `dev`, or a genesis.json path.
    pub fn load(name_or_path: &str) -> Result<Self, ChainParamsError> {
        match name_or_path {
            "mainnet" => Ok(Self::mainnet()),
            "dev" => Ok(Self::dev()),
            // Anything that looks like a path is read as one, so that a typo or an unreadable
            // file gets the file's own error rather than "unknown chain".
            path if Path::new(path).exists() || path.contains('/') || path.ends_with(".json") => {
                Self::from_genesis_file(Path::new(path))
            }
            other => Err(ChainParamsError::Unknown(other.to_string())),
        }
    }

    /// Reads a geth-style genesis.json.
    pub fn from_genesis_file(path: &Path) -> Result<Self, ChainParamsError> {
        let display = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| ChainParamsError::Io {
            path: display.clone(),
            source,
        })?;
        let json = |source| ChainParamsError::Json {
            path: display.clone(),
            source,
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(json)?;
        let invalid = |reason: &str| ChainParamsError::Invalid {
            path: display.clone(),
            reason: reason.to_string(),
        };
        if value.pointer("/config/chainId").is_none() {
            return Err(invalid("`config.chainId` is missing"));
        }
        if value.get("gasLimit").is_none() {
            return Err(invalid("`gasLimit` is missing"));
        }
        let genesis: Genesis = serde_json::from_value(value).map_err(json)?;
        if genesis.gas_limit == 0 {
            return Err(invalid(
                "`gasLimit` is zero: no block could hold a transaction",
            ));
        }
        if genesis
            .base_fee_per_gas
            .is_some_and(|fee| u64::try_from(fee).is_err())
        {
            return Err(invalid("`baseFeePerGas` does not fit in 64 bits"));
        }
        Ok(Self::from_genesis(genesis))
    }

    /// Replaces the activation of one fork (used by test networks such as
    /// `ShanghaiToCancunAtTime15k`).
    pub fn with_fork(mut self, fork: EthereumHardfork, condition: ForkCondition) -> Self {
        self.hardforks.retain(|(f, _)| *f != fork);
        self.hardforks.push((fork, condition));
        self
    }

    /// Blob parameters in force at `timestamp`, `None` before Cancun: the latest
    /// blob-parameter-only fork active, else Osaka's, Prague's or Cancun's (reth's
    /// `blob_params_at_timestamp`).
    pub fn blob_params_at(&self, timestamp: u64) -> Option<BlobParams> {
        let params = &self.blob_params;
        if let Some(scheduled) = params.active_scheduled_params_at_timestamp(timestamp) {
            Some(*scheduled)
        } else if self.is_osaka_active_at_timestamp(timestamp) {
            Some(params.osaka)
        } else if self.is_prague_active_at_timestamp(timestamp) {
            Some(params.prague)
        } else if self.is_cancun_active_at_timestamp(timestamp) {
            Some(params.cancun)
        } else {
            None
        }
    }

    /// EIP-1559 parameters (Ethereum's).
    pub fn base_fee_params(&self) -> BaseFeeParams {
        BaseFeeParams::ethereum()
    }

    /// The genesis header for a genesis state whose root is `state_root` (computed by the trie
    /// crate; primitives does not hash tries).
    pub fn genesis_header(&self, state_root: B256) -> Header {
        let g = &self.genesis;
        let london = self.is_london_active_at_block(0);
        let shanghai = self.is_shanghai_active_at_timestamp(g.timestamp);
        let cancun = self.is_cancun_active_at_timestamp(g.timestamp);
        let prague = self.is_prague_active_at_timestamp(g.timestamp);
        Header {
            parent_hash: g.parent_hash.unwrap_or_default(),
            ommers_hash: EMPTY_OMMER_ROOT_HASH,
            beneficiary: g.coinbase,
            state_root,
            transactions_root: calculate_transaction_root::<alloy_consensus::TxEnvelope>(&[]),
            receipts_root: EMPTY_ROOT_HASH,
            logs_bloom: Default::default(),
            difficulty: g.difficulty,
            number: g.number.unwrap_or_default(),
            gas_limit: g.gas_limit,
            gas_used: 0,
            timestamp: g.timestamp,
            extra_data: g.extra_data.clone(),
            mix_hash: g.mix_hash,
            nonce: g.nonce.into(),
            base_fee_per_gas: london.then(|| {
                // `from_genesis_file` rejects a base fee above 64 bits; a spec built in code
                // with one gets the largest, never a truncated one.
                g.base_fee_per_gas
                    .map(|f| u64::try_from(f).unwrap_or(u64::MAX))
                    .unwrap_or(INITIAL_BASE_FEE)
            }),
            withdrawals_root: shanghai.then_some(EMPTY_WITHDRAWALS),
            blob_gas_used: cancun.then(|| g.blob_gas_used.unwrap_or_default()),
            excess_blob_gas: cancun.then(|| g.excess_blob_gas.unwrap_or_default()),
            parent_beacon_block_root: cancun.then_some(B256::ZERO),
            requests_hash: prague.then_some(EMPTY_REQUESTS_HASH),
            ..Default::default()
        }
    }
}

impl EthereumHardforks for ChainParams {
    fn ethereum_fork_activation(&self, fork: EthereumHardfork) -> ForkCondition {
        self.hardforks
            .iter()
            .find(|(f, _)| *f == fork)
            .map(|(_, c)| *c)
            .unwrap_or_default()
    }
}

impl EthExecutorSpec for ChainParams {
    fn deposit_contract_address(&self) -> Option<Address> {
        self.deposit_contract_address
    }
}

/// A chain config with every block-numbered fork through the merge (Paris) at genesis and no
/// timestamp fork: what post-merge dev and test chains start from.
pub fn merged_chain_config(chain_id: u64) -> ChainConfig {
    ChainConfig {
        chain_id,
        homestead_block: Some(0),
        eip150_block: Some(0),
        eip155_block: Some(0),
        eip158_block: Some(0),
        byzantium_block: Some(0),
        constantinople_block: Some(0),
        petersburg_block: Some(0),
        istanbul_block: Some(0),
        berlin_block: Some(0),
        london_block: Some(0),
        merge_netsplit_block: Some(0),
        terminal_total_difficulty: Some(U256::ZERO),
        terminal_total_difficulty_passed: true,
        ..Default::default()
    }
}

/// Address of dev account `i`.
pub fn dev_address(i: usize) -> Address {
    let key = ChainParams::dev_private_key(i);
    let secret =
        secp256k1::SecretKey::from_slice(key.as_slice()).expect("keccak output is a valid key");
    let public = secp256k1::PublicKey::from_secret_key(secp256k1::SECP256K1, &secret);
    alloy_primitives::Address::from_raw_public_key(&public.serialize_uncompressed()[1..])
}

/// The system contracts a Prague chain needs at genesis.
fn system_contracts() -> [(Address, Bytes); 4] {
    [
        (
            eip4788::BEACON_ROOTS_ADDRESS,
            eip4788::BEACON_ROOTS_CODE.clone(),
        ),
        (
            eip2935::HISTORY_STORAGE_ADDRESS,
            eip2935::HISTORY_STORAGE_CODE.clone(),
        ),
        (
            eip7002::WITHDRAWAL_REQUEST_PREDEPLOY_ADDRESS,
            eip7002::WITHDRAWAL_REQUEST_PREDEPLOY_CODE.clone(),
        ),
        (
            eip7251::CONSOLIDATION_REQUEST_PREDEPLOY_ADDRESS,
            eip7251::CONSOLIDATION_REQUEST_PREDEPLOY_CODE.clone(),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_eips::{eip7594::MAX_BLOBS_PER_TX_FUSAKA, eip7840::BLOB_BASE_COST};

    #[test]
    fn mainnet_blob_parameters_follow_its_forks() {
        let spec = ChainParams::mainnet();
        let at = |fork| match spec.ethereum_fork_activation(fork) {
            ForkCondition::Timestamp(time) => spec.blob_params_at(time),
            other => panic!("{fork:?} activates at {other:?}"),
        };
        assert_eq!(at(EthereumHardfork::Cancun), Some(BlobParams::cancun()));
        assert_eq!(at(EthereumHardfork::Prague), Some(BlobParams::prague()));
        assert_eq!(at(EthereumHardfork::Osaka), Some(BlobParams::osaka()));
        assert_eq!(at(EthereumHardfork::Bpo1), Some(BlobParams::bpo1()));
        assert_eq!(at(EthereumHardfork::Bpo2), Some(BlobParams::bpo2()));
        assert_eq!(spec.blob_params_at(0), None);
    }

    /// A genesis's blob schedule sets each fork's parameters; the blob-parameter-only forks
    /// take effect at their time with Osaka's per-transaction limit and blob base cost.
    #[test]
    fn genesis_blob_schedule_is_read_by_fork() {
        let custom = BlobParams {
            target_blob_count: 20,
            max_blob_count: 30,
            update_fraction: 9_000_000,
            ..BlobParams::cancun()
        };
        let mut genesis = Genesis::default();
        genesis.config.london_block = Some(0);
        genesis.config.shanghai_time = Some(0);
        genesis.config.cancun_time = Some(0);
        genesis.config.prague_time = Some(0);
        genesis.config.osaka_time = Some(0);
        genesis.config.bpo1_time = Some(100);
        genesis.config.blob_schedule.insert("bpo1".into(), custom);
        let spec = ChainParams::from_genesis(genesis);
        assert!(spec.is_bpo1_active_at_timestamp(100));
        assert_eq!(spec.blob_params_at(99), Some(BlobParams::osaka()));
        assert_eq!(
            spec.blob_params_at(100),
            Some(BlobParams {
                max_blobs_per_tx: MAX_BLOBS_PER_TX_FUSAKA,
                blob_base_cost: BLOB_BASE_COST,
                ..custom
            })
        );
    }
}
